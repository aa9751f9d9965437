"""A Conformer ASR encoder (Gulati et al., 2020), written the way a user writes one.

Features ``[B, T, F]`` and lengths ``[B]`` in; log-probs ``[B, T', C]`` and
the subsampled lengths out, with ``T' = ((T - 3) // 2 + 1 - 3) // 2 + 1``
(two ``Conv2d(k=3, stride=2, padding="valid")``). Each block is macaron
feed-forward / relative-position self-attention / convolution module /
feed-forward / LayerNorm. Attention goes through
``F.scaled_dot_product_attention`` with the position scores and the key
padding mask as one float mask, as transformers' speech encoders do; that is
the case the dynamo exporter cannot export without ``sdpa_math``. The
depthwise conv uses ``padding="same"``, the case ``conv_padding`` is for.

Sizes: ``tiny()`` for tests, ``base()`` (12 x 256) for the benchmarks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from onnx_compat.spec import Dim, TensorSpec


def _mask(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]  # [B, T]


class Subsampling(nn.Module):
    """4x in time: two Conv2d(k=3, stride=2) over (time, features)."""

    def __init__(self, features: int, dim: int, channels: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=2, padding="valid")
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=2, padding="valid")
        freq = ((features - 3) // 2 + 1 - 3) // 2 + 1
        self.out = nn.Linear(channels * freq, dim)

    def forward(self, x, lengths):
        x = F.silu(self.conv2(F.silu(self.conv1(x[:, None]))))  # [B, C, T', F']
        x = self.out(x.transpose(1, 2).flatten(2))
        for _ in range(2):
            lengths = torch.div(lengths - 3, 2, rounding_mode="floor") + 1
        return x, lengths


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.SiLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, dim), nn.Dropout(dropout))


def relative_positions(length: int, dim: int, device=None) -> torch.Tensor:
    """Sinusoidal encodings of the distances T-1 ... -(T-1): ``[2T-1, dim]``."""
    distance = torch.arange(length - 1, -length, -1, device=device, dtype=torch.float32)
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angles = distance[:, None] * freq[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


class RelPosSelfAttention(nn.Module):
    """Transformer-XL style self-attention: content and position scores with biases u, v."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.pos = nn.Linear(dim, dim, bias=False)
        self.bias_u = nn.Parameter(torch.randn(heads, self.head_dim) * 0.1)
        self.bias_v = nn.Parameter(torch.randn(heads, self.head_dim) * 0.1)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x, mask):
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.pos(relative_positions(T, D, x.device)).view(2 * T - 1, self.heads, self.head_dim).transpose(0, 1)
        scores = torch.matmul(q + self.bias_v[:, None], p.transpose(-2, -1))  # [B, H, T, 2T-1]
        # distance j - i sits at column (T - 1) - (j - i)
        i = torch.arange(T, device=x.device)
        index = (T - 1) - i[None, :] + i[:, None]
        position = scores.gather(-1, index.expand(B, self.heads, T, T)) / math.sqrt(self.head_dim)
        attn_mask = position.masked_fill(~mask[:, None, None, :], float("-inf"))
        y = F.scaled_dot_product_attention(q + self.bias_u[:, None], k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class ConvModule(nn.Module):
    """pointwise -> GLU -> depthwise Conv1d(padding="same") -> BatchNorm -> SiLU -> pointwise."""

    def __init__(self, dim: int, kernel: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pointwise1 = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding="same", groups=dim)
        self.batch_norm = nn.BatchNorm1d(dim)
        self.pointwise2 = nn.Conv1d(dim, dim, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        y = F.glu(self.pointwise1(self.norm(x).transpose(1, 2)), dim=1)
        y = y * mask[:, None, :]  # padding must not leak into valid frames
        y = self.pointwise2(F.silu(self.batch_norm(self.depthwise(y))))
        return self.dropout(y.transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int, kernel: int, dropout: float):
        super().__init__()
        self.ff1 = FeedForward(dim, ff, dropout)
        self.attn = RelPosSelfAttention(dim, heads, dropout)
        self.conv = ConvModule(dim, kernel, dropout)
        self.ff2 = FeedForward(dim, ff, dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, mask):
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x, mask)
        x = x + self.conv(x, mask)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class ConformerEncoder(nn.Module):
    def __init__(self, features: int = 40, classes: int = 32, dim: int = 64, layers: int = 2, heads: int = 4,
                 ff: int = 0, kernel: int = 31, dropout: float = 0.1):
        super().__init__()
        self.subsampling = Subsampling(features, dim)
        self.blocks = nn.ModuleList(ConformerBlock(dim, heads, ff or 4 * dim, kernel, dropout) for _ in range(layers))
        self.output = nn.Linear(dim, classes)

    def forward(self, data: torch.Tensor, lengths: torch.Tensor):
        x, lengths = self.subsampling(data, lengths)
        mask = _mask(x, lengths)
        for block in self.blocks:
            x = block(x, mask)
        return self.output(x).log_softmax(-1), lengths


def io_specs(features: int = 40, classes: int = 32):
    """``data``/``data:size1`` -> ``output``/``output:size1`` (time subsampled 4x)."""
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time", min=16), features], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim("time_sub4"), classes], lengths=[1])]
    return inputs, outputs


def _job(model: ConformerEncoder, features: int, classes: int):
    inputs, outputs = io_specs(features, classes)
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


def tiny(features: int = 20, classes: int = 12, seed: int = 0):
    """Two blocks of dim 32, kernel 7: seconds to export, for tests and the demo."""
    torch.manual_seed(seed)
    model = ConformerEncoder(features, classes, dim=32, layers=2, heads=4, kernel=7)
    return _job(model, features, classes)


def base(features: int = 80, classes: int = 1000, seed: int = 0):
    """Twelve blocks of dim 256, 4 heads, kernel 31: the benchmark size."""
    torch.manual_seed(seed)
    model = ConformerEncoder(features, classes, dim=256, layers=12, heads=4, kernel=31)
    return _job(model, features, classes)
