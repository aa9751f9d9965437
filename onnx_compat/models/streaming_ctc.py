"""A cache-aware streaming Conformer CTC model in NeMo's layout, as sherpa-onnx's online NeMo CTC runs it.

NeMo's cache-aware streaming encoders (``FastConformer`` with
``att_context_size`` and causal convolutions) are exported with one call per
chunk and three states, batch first:

- ``cache_last_channel`` ``[N, layers, left, D]``: the last ``left`` frames of
  each layer's (normalised) attention input -- the "channel" cache, from which
  keys and values of the left context are recomputed;
- ``cache_last_time`` ``[N, layers, D, kernel - 1]``: the last inputs of each
  layer's causal depthwise convolution -- the "time" cache;
- ``cache_last_channel_len`` int64 ``[N]``: how many of the ``left`` slots are
  filled (the rest are masked out), starting at 0.

One call takes ``window = 4 * chunk + 3`` feature frames ``[N, C, window]``
(the subsampling convolution, kernel 7 and stride 4, needs 3 frames past the
chunk) and their count, and returns ``chunk`` frames of log-probs, their
count and the next states. The stream advances by ``4 * chunk`` frames, so the
windows overlap by 3 frames and every output frame is produced once.
"""
from __future__ import annotations

import torch
from torch import nn

from ..spec import Dim, TensorSpec
from .streaming_conformer import CausalConvModule, FeedForward

SUBSAMPLING = 4
SUBSAMPLING_KERNEL = 7  # frames one output frame sees: the window is SUBSAMPLING * chunk + 3


class ChannelCacheAttention(nn.Module):
    """Self-attention over the chunk and the cached (normalised) inputs of the ``left`` frames before it."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [N, T, D] -> [N, H, T, D/H]
        return x.reshape(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

    def forward(self, x, cache, cache_len):
        """``cache`` ``[N, left, D]``, ``cache_len`` int64 ``[N]``; returns ``(y, new_cache)``."""
        left = cache.shape[1]
        normed = self.norm(x)
        context = torch.cat([cache, normed], dim=1)
        k, v = self.kv(context).chunk(2, dim=-1)
        q = self._split(self.q(normed))
        scores = q @ self._split(k).transpose(-1, -2) / (q.shape[-1] ** 0.5)
        slot = torch.arange(context.shape[1], device=x.device)
        allowed = slot[None, :] >= (left - cache_len)[:, None]  # unfilled cache slots masked
        weights = scores.masked_fill(~allowed[:, None, None, :], float("-inf")).softmax(-1)
        y = (weights @ self._split(v)).transpose(1, 2)
        return self.out(y.reshape(y.shape[0], y.shape[1], -1)), context[:, context.shape[1] - left:]


class CacheAwareBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, kernel: int):
        super().__init__()
        self.ff1, self.ff2 = FeedForward(dim, ff), FeedForward(dim, ff)
        self.attention = ChannelCacheAttention(dim, heads)
        self.conv = CausalConvModule(dim, kernel)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, channel, time, channel_len):
        x = x + 0.5 * self.ff1(x)
        y, channel = self.attention(x, channel, channel_len)
        x = x + y
        y, time = self.conv.step(x, time)
        x = x + y
        return self.norm(x + 0.5 * self.ff2(x)), channel, time


class CacheAwareConformerCTC(nn.Module):
    """``forward(features [N, C, window], lengths [N], cache_last_channel, cache_last_time, cache_last_channel_len)``
    -> ``(log_probs [N, chunk, V + 1], lengths, next caches)`` -- NeMo's exported streaming signature."""

    def __init__(self, features: int = 80, dim: int = 48, heads: int = 4, layers: int = 2, ff: int = 96,
                 kernel: int = 5, classes: int = 17, chunk: int = 4, left: int = 8):
        super().__init__()
        self.features, self.dim, self.layers, self.kernel = features, dim, layers, kernel
        self.classes, self.chunk, self.left = classes, chunk, left
        self.subsampling = nn.Conv1d(features, dim, SUBSAMPLING_KERNEL, stride=SUBSAMPLING)
        self.blocks = nn.ModuleList(CacheAwareBlock(dim, heads, ff, kernel) for _ in range(layers))
        self.output = nn.Linear(dim, classes)

    @property
    def window(self) -> int:
        return SUBSAMPLING * self.chunk + SUBSAMPLING_KERNEL - SUBSAMPLING

    @property
    def shift(self) -> int:
        return SUBSAMPLING * self.chunk

    def forward(self, features, lengths, cache_last_channel, cache_last_time, cache_last_channel_len):
        x = self.subsampling(features).transpose(1, 2)  # [N, C, window] -> [N, chunk, D]
        channels, times = [], []
        for i, block in enumerate(self.blocks):
            x, channel, time = block(x, cache_last_channel[:, i], cache_last_time[:, i], cache_last_channel_len)
            channels.append(channel)
            times.append(time)
        log_probs = self.output(x).log_softmax(-1)
        out_lengths = torch.div(lengths - (SUBSAMPLING_KERNEL - SUBSAMPLING), SUBSAMPLING, rounding_mode="floor")
        filled = torch.clamp(cache_last_channel_len + x.shape[1], max=self.left)
        return log_probs, out_lengths, torch.stack(channels, 1), torch.stack(times, 1), filled


def vocabulary(classes: int = 17):
    """NeMo's order: the tokens, then the blank last."""
    return [f"t{i}" for i in range(classes - 1)] + ["<blk>"]


def streaming_ctc_job(features: int = 80, dim: int = 48, layers: int = 2, classes: int = 17, chunk: int = 4,
                      left: int = 8, kernel: int = 5, seed: int = 0) -> dict:
    """``export_streaming(**job, contract="sherpa-onnx/online-nemo-ctc")``'s arguments for the bundled model."""
    from ..streaming import StateSpec
    torch.manual_seed(seed)
    model = CacheAwareConformerCTC(features, dim, layers=layers, classes=classes, chunk=chunk, left=left,
                                   kernel=kernel).eval()
    batch = Dim("batch")
    return {
        "step": model,
        "inputs": [TensorSpec("audio_signal", [batch, features, Dim("window")], lengths=[2],
                              lengths_dtype=torch.int64)],
        "states": [StateSpec("cache_last_channel", [batch, layers, left, dim]),
                   StateSpec("cache_last_time", [batch, layers, dim, kernel - 1]),
                   StateSpec("cache_last_channel_len", [batch], torch.int64)],
        "outputs": [TensorSpec("log_probs", [batch, Dim("frames"), classes], lengths=[1],
                               lengths_dtype=torch.int64)],
        "chunk": model.window,
        "shift": model.shift,
        "time_axis": 2,
        "vocabulary": vocabulary(classes),
    }
