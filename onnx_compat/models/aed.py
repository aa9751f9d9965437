"""An attention encoder-decoder: the bundled Conformer encoder, an LSTM decoder with attention, a CTC head.

Encoder: the ``ConformerEncoder`` of ``conformer.py`` up to its last block
(features ``[B, T, F]`` -> ``[B, T', E]``, ``T'`` about ``T / 4``); its own
output layer is the CTC head (``vocab + 1`` classes, blank last). Decoder:
one step takes the previous label's embedding and the previous attention
context through an ``nn.LSTM`` (``h, c`` ``[1, B, H]``: PyTorch's layout,
hypothesis batch second), attends over the encoder frames (masked by their
lengths) and returns the new ``(h, c, context)``; the output layer reads
``h`` and the context. The decoder starts from zeros fed ``sentence_end`` as
the start label, as most AED recipes do.

``greedy_decode``: label-synchronous greedy search until ``sentence_end`` or
``max_labels``.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from .conformer import ConformerEncoder, _mask


class AttentionDecoder(nn.Module):
    def __init__(self, vocab: int, encoder_dim: int, hidden: int, embed: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed + encoder_dim, hidden, 1)
        self.query = nn.Linear(hidden, encoder_dim, bias=False)
        self.output = nn.Linear(hidden + encoder_dim, vocab)

    def attend(self, h: torch.Tensor, enc: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``h`` ``[B, H]`` over ``enc`` ``[B, T, E]`` (frames past ``lengths`` masked) -> context ``[B, E]``."""
        energies = torch.einsum("bte,be->bt", enc, self.query(h)) / enc.shape[-1] ** 0.5
        energies = energies.masked_fill(~_mask(enc, lengths), float("-inf"))
        return torch.einsum("bt,bte->be", energies.softmax(-1), enc)


class AED(nn.Module):
    def __init__(self, features: int = 20, vocab: int = 10, dim: int = 32, hidden: int = 32, embed: int = 16,
                 sentence_end: int = 0, layers: int = 1):
        super().__init__()
        self.vocab, self.hidden, self.dim, self.sentence_end = vocab, hidden, dim, sentence_end
        self.encoder = ConformerEncoder(features, vocab + 1, dim=dim, layers=layers, heads=4, kernel=7)
        self.decoder = AttentionDecoder(vocab, dim, hidden, embed)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor):
        """``[B, T, F]``, ``[B]`` -> encoder frames ``[B, T', E]`` and their lengths."""
        x, lengths = self.encoder.subsampling(features, lengths)
        mask = _mask(x, lengths)
        for block in self.encoder.blocks:
            x = block(x, mask)
        return x, lengths

    def ctc_log_probs(self, frames: torch.Tensor) -> torch.Tensor:
        """The CTC head on encoder frames ``[..., E]``: log-probs over ``vocab + 1`` (blank last)."""
        return self.encoder.output(frames).log_softmax(-1)

    def initial_states(self, enc: torch.Tensor, lengths: torch.Tensor):
        """The decoder after the start label from zeros: ``(h, c, context)``, ``h, c`` ``[1, B, H]``."""
        batch = enc.shape[0]
        zeros = enc.new_zeros(1, batch, self.hidden)
        start = torch.full((batch,), self.sentence_end, dtype=torch.long, device=enc.device)
        return self.step(start, enc, lengths, zeros, zeros, enc.new_zeros(batch, self.dim))

    def step(self, token: torch.Tensor, enc: torch.Tensor, lengths: torch.Tensor, h: torch.Tensor,
             c: torch.Tensor, context: torch.Tensor):
        """One label ``[B]`` in: the new ``(h, c, context)``."""
        x = torch.cat([self.decoder.embedding(token.long()), context], -1)[None]
        y, (h, c) = self.decoder.lstm(x, (h, c))
        return h, c, self.decoder.attend(y[0], enc, lengths)

    def log_probs(self, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The next label's log-probs ``[B, V]`` from the decoder state."""
        return self.decoder.output(torch.cat([h[-1], context], -1)).log_softmax(-1)

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, max_labels: int = None) -> List[int]:
        """Labels of one utterance ``[1, T, F]`` until ``sentence_end`` (left out) or ``max_labels``
        (default: twice the encoder frames)."""
        enc, lengths = self.encode(features, torch.tensor([features.shape[1]], dtype=torch.int32))
        h, c, context = self.initial_states(enc, lengths)
        labels: List[int] = []
        for _ in range(max_labels if max_labels is not None else 2 * enc.shape[1]):
            best = int(self.log_probs(h, context).argmax(-1))
            if best == self.sentence_end:
                break
            labels.append(best)
            h, c, context = self.step(torch.tensor([best]), enc, lengths, h, c, context)
        return labels


def tiny(features: int = 20, vocab: int = 10, seed: int = 0) -> AED:
    """One Conformer block of dim 32, a 32-unit decoder: seconds to export (the dynamo exporter's time grows
    with the blocks).

    Some weights are scaled as training would have made them: a random init decodes one label repeated
    (the encoder frames share a large constant part, the attention is flat). Here the previous label and the
    LSTM state drive the output, the attention is sharp, and the CTC head's blank does not win every frame,
    so decodes are varied label sequences, which is what a decode comparison needs to prove anything."""
    torch.manual_seed(seed)
    model = AED(features, vocab)
    hidden = model.hidden
    with torch.no_grad():
        model.decoder.embedding.weight.mul_(5)
        model.decoder.lstm.weight_ih_l0.mul_(2)
        model.decoder.output.weight[:, :hidden].mul_(20)
        model.decoder.output.weight[:, hidden:].mul_(4)
        model.decoder.output.bias[model.sentence_end] -= 1.0
        model.decoder.query.weight.mul_(8)
        model.encoder.output.weight.mul_(4)
        model.encoder.output.bias[-1] -= 0.5
    return model.eval()


def label_scorer_job(kind: str = "stateful", seed: int = 0) -> dict:
    """``export_label_scorer`` arguments for the tiny AED as RASR's ``stateful-onnx`` (``kind="stateful"``) or
    its CTC head as ``no-context-onnx`` (``kind="ctc"``); the factory the ``label-scorer`` verb takes."""
    from ..spec import Dim, TensorSpec
    from ..streaming import StateSpec
    model = tiny(seed=seed)
    hyps = Dim("hyps")
    common = dict(encoder=model.encode, encoder_dim=model.dim, module=model,
                  features=TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20], lengths=[1]))
    vocabulary = ["</s>"] + [f"label{i}" for i in range(1, model.vocab)]
    if kind == "ctc":
        return dict(kind="ctc", score=model.ctc_log_probs, vocabulary=vocabulary + ["<blank>"], blank=model.vocab,
                    **common)
    return dict(kind="stateful", initial=model.initial_states, update=model.step, score=model.log_probs,
                states=[StateSpec("h", [1, hyps, model.hidden]), StateSpec("c", [1, hyps, model.hidden]),
                        StateSpec("context", [hyps, model.dim])],
                scorer_states=["h", "context"], vocabulary=vocabulary, sentence_end=model.sentence_end, **common)


def ctc_label_scorer_job() -> dict:
    """The CTC head as ``no-context-onnx`` (a factory without arguments, for the command line)."""
    return label_scorer_job("ctc")
