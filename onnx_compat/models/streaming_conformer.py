"""A chunked Conformer encoder whose stream equals its full forward.

Attention is chunked: frame ``t`` attends to every frame of its own chunk of
``chunk`` frames and of the ``left_chunks`` chunks before it (the mask of
``chunk_mask``); the depthwise convolution is causal (padded only on the
left). So one call of ``streaming_forward`` needs, per layer, the keys and
values of the last ``left_chunks * chunk`` frames (``cache_k``, ``cache_v``),
the last ``kernel - 1`` inputs of the depthwise convolution (``cache_conv``),
and how many frames came before (``processed``, per utterance: cache slots
not yet filled are masked out). Streamed chunk by chunk from zero caches, its
outputs are the full forward's to float precision.

Caches are stacked over layers, batch first: ``cache_k``/``cache_v``
``[B, layers, left, dim]``, ``cache_conv`` ``[B, layers, dim, kernel - 1]``,
``processed`` int64 ``[B]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import Dim, TensorSpec


def chunk_mask(length: int, chunk: int, left_chunks: int, device=None) -> torch.Tensor:
    """``[T, T]`` bool: query t may attend key s (same chunk or one of the ``left_chunks`` before)."""
    index = torch.arange(length, device=device) // chunk
    distance = index[:, None] - index[None, :]
    return (distance >= 0) & (distance <= left_chunks)


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, dim))


class ChunkedAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, H, T, D/H]
        return x.reshape(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

    def attend(self, q, k, v, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed``: bool, broadcastable to ``[B, H, Tq, Tk]``."""
        scores = self._split(q) @ self._split(k).transpose(-1, -2) / (q.shape[-1] // self.heads) ** 0.5
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        y = (weights @ self._split(v)).transpose(1, 2)
        return self.out(y.reshape(y.shape[0], y.shape[1], -1))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return self.attend(q, k, v, allowed)

    def step(self, x, cache_k, cache_v, processed):
        """One chunk against the cached keys/values of the left context; returns ``(y, new_k, new_v)``."""
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        keys, values = torch.cat([cache_k, k], dim=1), torch.cat([cache_v, v], dim=1)
        left = cache_k.shape[1]
        slot = torch.arange(keys.shape[1], device=x.device)
        allowed = slot[None, :] >= (left - processed)[:, None]  # [B, left + T]: unfilled cache slots masked
        y = self.attend(q, keys, values, allowed[:, None, None, :])
        return y, keys[:, keys.shape[1] - left:], values[:, values.shape[1] - left:]


class CausalConvModule(nn.Module):
    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.norm = nn.LayerNorm(dim)
        self.pointwise_in = nn.Linear(dim, 2 * dim)
        self.depthwise = nn.Conv1d(dim, dim, kernel, groups=dim)
        self.depth_norm = nn.LayerNorm(dim)
        self.pointwise_out = nn.Linear(dim, dim)

    def _before(self, x):  # [B, T, D] -> [B, D, T]
        return F.glu(self.pointwise_in(self.norm(x)), dim=-1).transpose(1, 2)

    def _after(self, y):  # [B, D, T] -> [B, T, D]
        return self.pointwise_out(F.silu(self.depth_norm(y.transpose(1, 2))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._after(self.depthwise(F.pad(self._before(x), (self.kernel - 1, 0))))

    def step(self, x, cache):
        """``cache``: the last ``kernel - 1`` depthwise inputs ``[B, D, kernel - 1]``; returns ``(y, new_cache)``."""
        full = torch.cat([cache, self._before(x)], dim=2)
        return self._after(self.depthwise(full)), full[:, :, full.shape[2] - (self.kernel - 1):]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, kernel: int):
        super().__init__()
        self.ff1, self.ff2 = FeedForward(dim, ff), FeedForward(dim, ff)
        self.attention = ChunkedAttention(dim, heads)
        self.conv = CausalConvModule(dim, kernel)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, allowed):
        x = x + 0.5 * self.ff1(x)
        x = x + self.attention(x, allowed)
        x = x + self.conv(x)
        return self.norm(x + 0.5 * self.ff2(x))

    def step(self, x, cache_k, cache_v, cache_conv, processed):
        x = x + 0.5 * self.ff1(x)
        y, k, v = self.attention.step(x, cache_k, cache_v, processed)
        x = x + y
        y, conv = self.conv.step(x, cache_conv)
        x = x + y
        return self.norm(x + 0.5 * self.ff2(x)), k, v, conv


class StreamingConformer(nn.Module):
    def __init__(self, features: int = 20, dim: int = 32, heads: int = 4, layers: int = 2, ff: int = 64,
                 kernel: int = 5, classes: int = 12, chunk: int = 8, left_chunks: int = 2):
        super().__init__()
        self.chunk, self.left_chunks, self.dim, self.kernel = chunk, left_chunks, dim, kernel
        self.input = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ff, kernel) for _ in range(layers))
        self.output = nn.Linear(dim, classes)

    @property
    def left(self) -> int:
        return self.left_chunks * self.chunk

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        """The whole utterance at once, with the chunked attention mask."""
        allowed = chunk_mask(data.shape[1], self.chunk, self.left_chunks, data.device)
        x = self.input(data)
        for block in self.blocks:
            x = block(x, allowed)
        return self.output(x).log_softmax(-1)

    def streaming_forward(self, chunk, cache_k, cache_v, cache_conv, processed):
        x = self.input(chunk)
        ks, vs, convs = [], [], []
        for i, block in enumerate(self.blocks):
            x, k, v, conv = block.step(x, cache_k[:, i], cache_v[:, i], cache_conv[:, i], processed)
            ks.append(k)
            vs.append(v)
            convs.append(conv)
        out = self.output(x).log_softmax(-1)
        return out, torch.stack(ks, 1), torch.stack(vs, 1), torch.stack(convs, 1), processed + chunk.shape[1]


def streaming_job(features: int = 20, dim: int = 32, layers: int = 2, classes: int = 12, chunk: int = 8,
                  left_chunks: int = 2, kernel: int = 5, seed: int = 0) -> dict:
    """A factory for ``onnx-compat export-streaming onnx_compat.models.streaming_conformer:streaming_job``."""
    from ..streaming import StateSpec
    torch.manual_seed(seed)
    model = StreamingConformer(features, dim, layers=layers, classes=classes, chunk=chunk, left_chunks=left_chunks,
                               kernel=kernel).eval()
    batch = Dim("batch")
    left = left_chunks * chunk
    return {
        "step": model.streaming_forward,
        "inputs": [TensorSpec("data", [batch, chunk, features])],
        "states": [StateSpec("cache_k", [batch, layers, left, dim]), StateSpec("cache_v", [batch, layers, left, dim]),
                   StateSpec("cache_conv", [batch, layers, dim, kernel - 1]),
                   StateSpec("processed", [batch], torch.int64)],
        "outputs": [TensorSpec("output", [batch, chunk, classes])],
        "full_forward": model,
    }
