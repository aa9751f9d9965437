"""A transformers Whisper as the two graphs sherpa-onnx's Whisper loader runs: an encoder that hands out every
decoder layer's cross-attention K/V, and a decoder step with an explicit self-attention cache and an ``offset``.

transformers' ``WhisperEncoder`` refuses any input but ``2 * max_source_positions`` frames, while sherpa-onnx
feeds ``T = real frames + tail`` (at most 3000): ``WhisperEncoderGraph`` runs the same modules with the
positions sliced to the ``ceil(T / 2)`` frames the convolutions give. Its ``hidden`` is the encoder's output,
equal to ``WhisperEncoder`` at the full length (tests/test_sherpa_whisper.py).

``WhisperDecoderGraph`` is one decoder call as sherpa-onnx makes it (``offline-whisper-greedy-search-decoder.cc``):
``tokens [N, n]`` at positions ``offset .. offset + n - 1``, the self-attention K/V written into the full
``[layers, N, n_text_ctx, d_model]`` caches at those positions and attended causally (a key after the query's
position is masked), the cross-attention on the encoder's K/V. It uses the model's own layers' projections, norms
and feed-forward; only the cache handling is its own. The caches are updated by a 0/1 placement matrix (sums
with exact zeros), so the written values are the projections themselves.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[N, S, D]`` -> ``[N, H, S, D / H]``."""
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
           mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-head attention of an already scaled ``q`` ``[N, n, D]`` over ``k``/``v`` ``[N, S, D]``; ``mask``
    ``[n, S]`` is added to the scores (``-inf``: not attended)."""
    scores = torch.matmul(_heads(q, heads), _heads(k, heads).transpose(-1, -2))
    if mask is not None:
        scores = scores + mask
    out = torch.matmul(torch.softmax(scores, dim=-1), _heads(v, heads))
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


class WhisperEncoderGraph(nn.Module):
    """``mel [N, n_mels, T]`` -> ``n_layer_cross_k``, ``n_layer_cross_v`` ``[n_text_layer, N, ceil(T/2), d_model]``:
    the encoder's output through every decoder layer's cross-attention key and value projections."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder = model.model.encoder
        self.decoder_layers = model.model.decoder.layers

    def hidden(self, mel: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state ``[N, ceil(T/2), d_model]`` at any ``T`` up to its positions."""
        enc = self.encoder
        x = nn.functional.gelu(enc.conv1(mel))
        x = nn.functional.gelu(enc.conv2(x)).permute(0, 2, 1)
        x = x + enc.embed_positions.weight[:x.shape[1]]
        for layer in enc.layers:
            x = layer(x, None)
        return enc.layer_norm(x)

    def forward(self, mel: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.hidden(mel)
        k = torch.stack([layer.encoder_attn.k_proj(h) for layer in self.decoder_layers])
        v = torch.stack([layer.encoder_attn.v_proj(h) for layer in self.decoder_layers])
        return k, v


class WhisperDecoderGraph(nn.Module):
    """``(tokens, self_k, self_v, cross_k, cross_v, offset)`` -> ``(logits, self_k, self_v)``, sherpa-onnx's order."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.proj_out = model.proj_out
        self.heads = model.config.decoder_attention_heads

    def _layer(self, layer, x, k_cache, v_cache, place, keep, mask, cross_k, cross_v):
        """One decoder layer: self-attention over the updated cache, cross-attention, feed-forward."""
        att = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        q = att.q_proj(h) * att.scaling
        k_cache = k_cache * keep + torch.matmul(place, att.k_proj(h))
        v_cache = v_cache * keep + torch.matmul(place, att.v_proj(h))
        x = x + att.out_proj(attend(q, k_cache, v_cache, self.heads, mask))
        cross = layer.encoder_attn
        q = cross.q_proj(layer.encoder_attn_layer_norm(x)) * cross.scaling
        x = x + cross.out_proj(attend(q, cross_k, cross_v, self.heads))
        h = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return x + h, k_cache, v_cache

    def forward(self, tokens, self_k, self_v, cross_k, cross_v, offset):
        dec = self.decoder
        positions = offset.reshape(-1)[:1] + torch.arange(tokens.shape[1], device=tokens.device)
        x = dec.embed_tokens(tokens) + dec.embed_positions.weight.index_select(0, positions)
        slots = torch.arange(self_k.shape[2], device=tokens.device)
        place = (slots[:, None] == positions[None, :]).to(x.dtype)          # [ctx, n]: where each new K/V goes
        keep = (1 - place.sum(-1))[:, None]                                 # [ctx, 1]: the slots kept
        mask = torch.zeros(positions.shape[0], slots.shape[0], dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(slots[None, :] > positions[:, None], float("-inf"))
        new_k: List[torch.Tensor] = []
        new_v: List[torch.Tensor] = []
        for i, layer in enumerate(dec.layers):
            x, k, v = self._layer(layer, x, self_k[i], self_v[i], place, keep, mask, cross_k[i], cross_v[i])
            new_k.append(k)
            new_v.append(v)
        return self.proj_out(dec.layer_norm(x)), torch.stack(new_k), torch.stack(new_v)
