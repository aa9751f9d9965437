"""A Transformer decoder with a KV cache: a Transformer LM, or an AED decoder over the bundled Conformer.

``TransformerDecoder.step`` is the cached step RASR's ``state-managed-onnx`` (``transformer`` state
manager) calls: ``tokens [B, S]`` (the suffix) and their lengths, ``prefix_lengths [B]``, then per layer
the self-attention keys and values of the prefix ``[B, P, D]`` -- row b's last ``prefix_lengths[b]``
positions, the ones before them padding (RASR left-pads shorter prefixes with zeros) -- and, with
``encoder_dim``, the encoder frames ``[B, T, E]`` and their lengths (cross-attention). It returns the
suffix's log-probs ``[B, S, V]`` and its keys and values ``[B, S, D]``, one position per label: the
manager stacks them again for the next label. Positions are sinusoidal from ``prefix_lengths``, so a
left-padded row sees the same positions as alone. ``mask_padding=False`` leaves the padding unmasked: a
model that is right only when every hypothesis of a batch has the same prefix length (the proof must
refuse it).

``greedy_decode`` is the model's own decode without any cache: the whole label sequence through ``step``
from an empty prefix at every label.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import nn

from .aed import AED
from .conformer import ConformerEncoder, _mask


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """``[B, S]`` integer positions -> ``[B, S, dim]`` sinusoidal encodings."""
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = positions.float()[..., None] * freq
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head attention of ``q [B, S, D]`` over ``k, v [B, N, D]``; ``mask [B, S, N]`` True where allowed."""
    b, s, d = q.shape
    n, h = k.shape[1], heads
    q = q.reshape(b, s, h, d // h).transpose(1, 2)
    k = k.reshape(b, n, h, d // h).transpose(1, 2)
    v = v.reshape(b, n, h, d // h).transpose(1, 2)
    w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // h)
    w = w.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
    return torch.matmul(w, v).transpose(1, 2).reshape(b, s, d)


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, encoder_dim: Optional[int]):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.out1 = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.cross = encoder_dim is not None
        if self.cross:
            self.norm2, self.query = nn.LayerNorm(dim), nn.Linear(dim, dim)
            self.kv, self.out2 = nn.Linear(encoder_dim, 2 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, ff), nn.ReLU(), nn.Linear(ff, dim))

    def forward(self, x, cache_k, cache_v, mask, enc=None, enc_mask=None):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, -1)
        x = x + self.out1(attend(q, torch.cat([cache_k, k], 1), torch.cat([cache_v, v], 1), mask, self.heads))
        if self.cross:
            ek, ev = self.kv(enc).chunk(2, -1)
            q = self.query(self.norm2(x))
            x = x + self.out2(attend(q, ek, ev, enc_mask[:, None, :].expand(-1, x.shape[1], -1), self.heads))
        return x + self.ff(x), k, v


class TransformerDecoder(nn.Module):
    def __init__(self, vocab: int = 10, dim: int = 32, heads: int = 4, layers: int = 2, ff: int = 64,
                 encoder_dim: Optional[int] = None, sentence_end: int = 0, mask_padding: bool = True):
        super().__init__()
        self.vocab, self.dim, self.sentence_end, self.mask_padding = vocab, dim, sentence_end, mask_padding
        self.embedding = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, ff, encoder_dim) for _ in range(layers))
        self.norm, self.output = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def _masks(self, tokens, token_lengths, prefix_lengths, prefix: int) -> torch.Tensor:
        """``[B, S, P + S]``: the prefix's own positions (not the left padding), the suffix causally."""
        batch, suffix = tokens.shape
        p = torch.arange(prefix, device=tokens.device)
        valid = p[None] >= (prefix - prefix_lengths)[:, None]
        if not self.mask_padding:
            valid = torch.ones_like(valid)
        s = torch.arange(suffix, device=tokens.device)
        own = (s[None, None, :] <= s[None, :, None]) & (s[None, None, :] < token_lengths[:, None, None])
        return torch.cat([valid[:, None, :].expand(-1, suffix, -1), own.expand(batch, -1, -1)], -1)

    def step(self, tokens, token_lengths, prefix_lengths, *rest):
        """``(log_probs [B, S, V], k_0, v_0, k_1, v_1, ...)``; ``rest``: the caches, then encoder frames and
        lengths when the decoder cross-attends."""
        caches, enc = rest[:2 * len(self.layers)], rest[2 * len(self.layers):]
        positions = prefix_lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)[None]
        x = self.embedding(tokens) + sinusoids(positions, self.dim)
        mask = self._masks(tokens, token_lengths, prefix_lengths, caches[0].shape[1])
        enc_mask = _mask(enc[0], enc[1]) if enc else None
        new = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, caches[2 * i], caches[2 * i + 1], mask, *((enc[0], enc_mask) if enc else ()))
            new += [k, v]
        return (self.output(self.norm(x)).log_softmax(-1), *new)

    def full_context(self, history: torch.Tensor, lengths: torch.Tensor, *enc) -> torch.Tensor:
        """The next label's log-probs ``[B, V]`` after each history ``[B, L]`` (right-padded; ``lengths`` its
        true lengths), recomputed from an empty prefix: RASR's ``full-context-onnx`` step."""
        empty = [history.new_zeros((history.shape[0], 0, self.dim), dtype=torch.float32)
                 for _ in range(2 * len(self.layers))]
        log_probs = self.step(history, lengths, lengths * 0, *empty, *enc)[0]
        return log_probs.gather(1, (lengths - 1)[:, None, None].expand(-1, 1, log_probs.shape[2]))[:, 0]

    def empty_caches(self, batch: int = 1) -> List[torch.Tensor]:
        return [torch.zeros(batch, 0, self.dim) for _ in range(2 * len(self.layers))]

    def state_specs(self, batch: str = "hyps"):
        from ..spec import Dim
        from ..streaming import StateSpec
        hyps, prefix = Dim(batch), Dim("prefix")
        return [StateSpec(f"l{i}_{kv}", [hyps, prefix, self.dim]) for i in range(len(self.layers)) for kv in "kv"]

    @torch.no_grad()
    def greedy_decode(self, max_labels: int, start: int = None, enc=None, enc_lengths=None) -> List[int]:
        """Labels after ``start`` (default ``sentence_end``) until ``sentence_end`` (left out) or ``max_labels``,
        the whole sequence recomputed at each label (no cache)."""
        labels = [self.sentence_end if start is None else start]
        enc_args = () if enc is None else (enc, enc_lengths)
        out: List[int] = []
        for _ in range(max_labels):
            tokens = torch.tensor([labels])
            log_probs = self.step(tokens, torch.tensor([len(labels)]), torch.tensor([0]), *self.empty_caches(),
                                  *enc_args)[0]
            best = int(log_probs[0, -1].argmax())
            if best == self.sentence_end:
                break
            out.append(best)
            labels.append(best)
        return out


class TransformerAED(nn.Module):
    """The bundled Conformer encoder (one block) and a 2-layer Transformer decoder cross-attending to it."""

    def __init__(self, features: int = 20, vocab: int = 10, dim: int = 32, layers: int = 2):
        super().__init__()
        self.dim = dim
        self.encoder = ConformerEncoder(features, vocab + 1, dim=dim, layers=1, heads=4, kernel=7)
        self.decoder = TransformerDecoder(vocab, dim, 4, layers, 2 * dim, encoder_dim=dim)

    encode = AED.encode  # the bundled Conformer's frames, as the LSTM AED reads them
    ctc_log_probs = AED.ctc_log_probs  # the encoder's own output layer as the CTC head, blank last

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, max_labels: int) -> List[int]:
        enc, lengths = self.encode(features, torch.tensor([features.shape[1]], dtype=torch.int32))
        return self.decoder.greedy_decode(max_labels, enc=enc, enc_lengths=lengths.long())


def _sharpen(decoder: TransformerDecoder, cross: bool) -> None:
    """Weights scaled as training would have made them: a random init scores nearly uniform labels, so a
    decode would be one label repeated or the sentence end at once. Here embeddings and the output layer
    dominate, the cross-attention is sharp, and the sentence end is rarer."""
    with torch.no_grad():
        decoder.embedding.weight.mul_(5 if cross else 3)
        decoder.output.weight.mul_(8 if cross else 4)
        decoder.output.bias[decoder.sentence_end] -= 1.5
        for layer in decoder.layers:
            layer.qkv.weight.mul_(2)
            if cross:
                layer.query.weight.mul_(3)


def tiny_lm(vocab: int = 10, seed: int = 0, mask_padding: bool = True) -> TransformerDecoder:
    """A 2-layer Transformer LM of dim 32 (``mask_padding=False``: the broken one the proof refuses)."""
    torch.manual_seed(seed)
    model = TransformerDecoder(vocab, 32, 4, 2, 64, mask_padding=mask_padding)
    _sharpen(model, cross=False)
    return model.eval()


def tiny_aed(features: int = 20, vocab: int = 10, seed: int = 0) -> TransformerAED:
    """The Conformer encoder (one block of dim 32) and a 2-layer Transformer decoder of dim 32."""
    torch.manual_seed(seed)
    model = TransformerAED(features, vocab)
    _sharpen(model.decoder, cross=True)
    return model.eval()


def label_scorer_job(kind: str = "lm", seed: int = 0) -> dict:
    """``export_label_scorer(kind="state-managed", manager="transformer")`` arguments: the tiny LM
    (``kind="lm"``) or the tiny AED (``kind="aed"``); ``kind="ctc"``: the AED's CTC head as
    ``no-context-onnx`` (blank last)."""
    from ..spec import Dim, TensorSpec
    vocabulary = ["</s>"] + [f"label{i}" for i in range(1, 10)]
    if kind == "lm":
        model = tiny_lm(seed=seed)
        return dict(kind="state-managed", manager="transformer", score=model.step, states=model.state_specs(),
                    vocabulary=vocabulary, sentence_end=0, start_label=0, module=model)
    model = tiny_aed(seed=seed)
    features = TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20], lengths=[1])
    if kind == "ctc":
        return dict(kind="ctc", encoder=model.encode, encoder_dim=model.dim, features=features, module=model,
                    score=model.ctc_log_probs, vocabulary=vocabulary + ["<blank>"], blank=len(vocabulary))
    return dict(kind="state-managed", manager="transformer", score=model.decoder.step,
                states=model.decoder.state_specs(), vocabulary=vocabulary, sentence_end=0, start_label=0,
                encoder=model.encode, encoder_dim=model.dim, module=model, features=features)
