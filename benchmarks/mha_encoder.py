"""A speech encoder built the way users build one from torch's own blocks (issue #29's attention model).

``nn.MultiheadAttention`` with a key padding mask from the lengths, a same-padded
depthwise conv and a feed-forward layer per block, ``blocks`` of them at width
``C``. Unlike the bundled Conformer (its own attention), the attention here is
torch's, so its export is what most users' models give.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat.spec import Dim, TensorSpec


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.conv = nn.Conv1d(dim, dim, kernel, padding="same", groups=dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, x, pad_mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=False)[0]
        x = x + self.conv(self.norm2(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ff(self.norm3(x))


class MhaEncoder(nn.Module):
    def __init__(self, features: int = 80, dim: int = 256, blocks: int = 12, heads: int = 4, kernel: int = 15):
        super().__init__()
        self.inp = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kernel) for _ in range(blocks))

    def forward(self, data, lengths):
        pad_mask = torch.arange(data.shape[1], device=data.device)[None, :] >= lengths[:, None]
        x = self.inp(data)
        for block in self.blocks:
            x = block(x, pad_mask)
        return x, lengths


def job(blocks: int = 12, dim: int = 256, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time"), 80], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim("time"), dim], lengths=[1])]
    return {"model": MhaEncoder(dim=dim, blocks=blocks).eval(), "inputs": inputs, "outputs": outputs}
