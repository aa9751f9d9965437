"""The bundled stateless transducer (``models/transducer.py``) split as sherpa-onnx loads a transducer: three graphs.

icefall's split, which sherpa-onnx's transducer loaders assume: the encoder applies the joint's encoder
projection, the decoder (a stateless prediction network over the last ``context`` labels) applies the joint's
prediction projection, and the joiner only adds them, ``tanh`` and the output layer. So
``joiner(encoder(x)[t], decoder(y)) == model.score(frame t, y)``: the same model, cut where the consumer calls it.

sherpa-onnx starts the decoder's context at ``[-1] * (context - 1) + [0]`` (blank 0); ``-1`` means "no label
yet", embedded as zeros (icefall's ``embedding(y.clamp(min=0)) * (y >= 0)``).

The encoder is a unidirectional LSTM: offline, it runs the whole utterance from zero states; online (sherpa-onnx's
``lstm`` type), one chunk of ``T`` frames with ``(h, c)`` ``[layers, N, hidden]`` carried from call to call.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from ..spec import Dim, TensorSpec
from . import transducer

BLANK = 0  # sherpa-onnx hard-codes the blank at 0


class SherpaSplit(torch.nn.Module):
    """The three callables of ``model`` (a ``transducer.StatelessTransducer`` with ``blank=0``)."""

    def __init__(self, model: "transducer.StatelessTransducer"):
        super().__init__()
        self.model = model

    def encoder(self, features: torch.Tensor, lengths: torch.Tensor):
        """``[N, T, C]``, ``[N]`` -> ``[N, T, J]``, ``[N]`` (the whole utterance, zero states)."""
        enc, lengths = self.model.encode(features, lengths)
        return self.model.joint.enc(enc), lengths

    def streaming_encoder(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """One chunk ``[N, T, C]`` and the LSTM's ``(h, c)`` ``[layers, N, hidden]`` -> ``[N, T, J]``, next h, c."""
        encoder = self.model.encoder
        y, (h, c) = encoder.lstm(torch.relu(encoder.input(x)), (h, c))
        return self.model.joint.enc(y), h, c

    def decoder(self, y: torch.Tensor) -> torch.Tensor:
        """``[N, context]`` int64 labels (``-1``: none yet) -> ``[N, J]``."""
        model = self.model
        embedded = model.embedding(y.clamp(min=0)) * (y >= 0).unsqueeze(-1).to(torch.float32)
        return model.joint.pred(torch.relu(model.mix(embedded.flatten(1))))

    def joiner(self, encoder_out: torch.Tensor, decoder_out: torch.Tensor) -> torch.Tensor:
        """``[N, J]`` and ``[N, J]`` -> log-probs ``[N, V]``."""
        return self.model.joint.out(torch.tanh(encoder_out + decoder_out)).log_softmax(-1)


def bundled(features: int = 80, vocab: int = 10, context: int = 2, seed: int = 0) -> SherpaSplit:
    """The small stateless LSTM transducer, blank 0, split for sherpa-onnx."""
    torch.manual_seed(seed)
    model = transducer.StatelessTransducer(features, vocab, context=context, blank=BLANK)
    transducer._lively(model.joint, model.blank)
    return SherpaSplit(model.eval()).eval()


def vocabulary(vocab: int = 10) -> List[str]:
    return ["<blk>"] + [f"w{i}" for i in range(1, vocab)]


def dims(split: SherpaSplit) -> Tuple[int, int, int, int, int]:
    """(features, joiner dim, vocabulary, context, LSTM layers) of the split model."""
    model = split.model
    return (model.encoder.input.in_features, model.joint.enc.out_features, model.vocab, model.context,
            model.encoder.lstm.num_layers)


def start_context(context: int) -> List[int]:
    return [-1] * (context - 1) + [BLANK]


def offline_parts(split: SherpaSplit):
    """encoder, decoder and joiner ``Part``s in sherpa-onnx's offline layout (no states)."""
    from ..parts import Part
    features, joiner_dim, vocab, context, _ = dims(split)
    n = Dim("batch")
    return [
        Part("encoder", split.encoder,
             [TensorSpec("x", [n, Dim("time", min=8), features], lengths=[1], lengths_dtype=torch.int64)],
             [TensorSpec("encoder_out", [n, Dim("frames"), joiner_dim], lengths=[1], lengths_dtype=torch.int64)]),
        *_decoder_joiner(split, n),
    ]


def online_parts(split: SherpaSplit, frames: int = 16):
    """The streaming encoder (``frames`` per call, ``(h, c)`` as states) + decoder + joiner, and the ``StateSpec``s."""
    from ..parts import Part
    from ..streaming import StateSpec
    features, joiner_dim, _, _, layers = dims(split)
    hidden = split.model.encoder.lstm.hidden_size
    n = Dim("batch")
    states = [StateSpec("h", [layers, n, hidden]), StateSpec("c", [layers, n, hidden])]
    encoder = Part("encoder", split.streaming_encoder, [TensorSpec("x", [n, frames, features])],
                   [TensorSpec("encoder_out", [n, frames, joiner_dim])], states_in=["h", "c"], states_out=["h", "c"])
    return [encoder, *_decoder_joiner(split, n)], states


def _decoder_joiner(split: SherpaSplit, n: Dim):
    from ..parts import Part
    _, joiner_dim, vocab, context, _ = dims(split)
    return [
        Part("decoder", split.decoder, [TensorSpec("y", [n, context], torch.int64, values=(-1, vocab))],
             [TensorSpec("decoder_out", [n, joiner_dim])]),
        Part("joiner", split.joiner, [TensorSpec("encoder_out", [n, joiner_dim]),
                                      TensorSpec("decoder_out", [n, joiner_dim])],
             [TensorSpec("logit", [n, vocab])]),
    ]


class ConformerEncoder(torch.nn.Module):
    """A cache-aware streaming Conformer (``streaming_ctc.CacheAwareConformerCTC``'s subsampling and blocks) as the
    transducer's encoder, in sherpa-onnx's online ``conformer`` layout: ``(x [N, T, C], attn [L, left, N, D],
    conv [L, kernel - 1, N, D], processed [N]) -> (encoder_out [N, T', J], attn, conv)``. The attention cache holds
    each layer's last ``left`` normalised inputs; ``processed`` (feature frames fed before the call, from sherpa-onnx)
    says how many of them are filled: ``min(processed // 4, left)``."""

    def __init__(self, conformer, projection: torch.nn.Linear):
        super().__init__()
        self.conformer, self.projection = conformer, projection

    def forward(self, x, attn, conv, processed):
        conformer = self.conformer
        h = conformer.subsampling(x.transpose(1, 2)).transpose(1, 2)
        filled = torch.clamp(torch.div(processed, 4, rounding_mode="floor"), max=conformer.left)
        attns, convs = [], []
        for i, block in enumerate(conformer.blocks):
            h, a, c = block(h, attn[i].transpose(0, 1), conv[i].permute(1, 2, 0), filled)
            attns.append(a.transpose(0, 1))
            convs.append(c.permute(2, 0, 1))
        return self.projection(h), torch.stack(attns), torch.stack(convs)


def conformer_parts(features: int = 80, vocab: int = 10, chunk: int = 4, left: int = 8, seed: int = 0):
    """A Conformer transducer (the cache-aware Conformer encoder, the stateless prediction network of
    ``models/transducer.py``) as sherpa-onnx's online ``conformer`` type: its three ``Part``s and ``StateSpec``s."""
    from ..parts import Part
    from ..streaming import StateSpec
    from .streaming_ctc import CacheAwareConformerCTC
    torch.manual_seed(seed)
    conformer = CacheAwareConformerCTC(features, dim=48, layers=2, chunk=chunk, left=left, kernel=5).eval()
    model = transducer.StatelessTransducer(features, vocab, encoder_dim=48, context=2, blank=BLANK)
    transducer._lively(model.joint, model.blank)
    split = SherpaSplit(model.eval()).eval()
    encoder = ConformerEncoder(conformer, model.joint.enc).eval()
    n, layers = Dim("batch"), len(conformer.blocks)
    states = [StateSpec("attn", [layers, left, n, 48]), StateSpec("conv", [layers, conformer.kernel - 1, n, 48]),
              StateSpec("processed_frames", [n], torch.int64)]
    part = Part("encoder", encoder, [TensorSpec("x", [n, conformer.window, features])],
                [TensorSpec("encoder_out", [n, chunk, model.joint.enc.out_features])],
                states_in=["attn", "conv", "processed_frames"], states_out=["attn", "conv"])
    return [part, *_decoder_joiner(split, n)], states, conformer.shift
