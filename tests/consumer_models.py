"""Small models in the layouts consumers expect, built around the bundled ones.

``FeaturesFirst`` is what a user writes to give the bundled Conformer
sherpa-onnx's NeMo layout (features ``[N, C, T]``, int64 lengths). With
``right_pad=0`` its output has the Conformer's "valid" subsampling length
``(T - 3) // 4`` -- fewer than the ``T // 4`` frames sherpa-onnx decodes;
``right_pad=3`` blanks each item's padding and appends three frames, so the
length is exactly ``T // 4`` and no item depends on what is padded after it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from onnx_compat import Dim, TensorSpec
from onnx_compat.models.conformer import ConformerEncoder

VALID_SUBSAMPLING_PAD = 3  # two Conv(k=3, stride=2, "valid"): (T + 3 - 3) // 4 == T // 4


class FeaturesFirst(nn.Module):
    def __init__(self, encoder: nn.Module, right_pad: int):
        super().__init__()
        self.encoder, self.right_pad = encoder, right_pad

    def forward(self, features: torch.Tensor, lengths: torch.Tensor):
        x = features.transpose(1, 2)  # [N, T, C]
        if self.right_pad:
            keep = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
            x = F.pad(torch.where(keep[:, :, None], x, torch.zeros_like(x)), (0, 0, 0, self.right_pad))
        log_probs, out_lengths = self.encoder(x, lengths.to(torch.int32) + self.right_pad)
        return log_probs, out_lengths


def conformer_ctc(features: int = 20, classes: int = 12, right_pad: int = VALID_SUBSAMPLING_PAD, seed: int = 0):
    """The bundled Conformer (2 blocks of 32) in the NeMo layout. Its random init decodes to one class
    everywhere; larger subsampling weights and no final-norm bias make the best class follow the input."""
    torch.manual_seed(seed)
    encoder = ConformerEncoder(features, classes, dim=32, layers=2, heads=4, kernel=7)
    with torch.no_grad():
        for w in (encoder.subsampling.conv1.weight, encoder.subsampling.conv2.weight):
            w.mul_(3)
        for block in encoder.blocks:
            block.norm.bias.zero_()
    return FeaturesFirst(encoder, right_pad).eval()


def nemo_specs(features: int = 20, classes: int = 12):
    batch = Dim("batch")
    inputs = [TensorSpec("features", [batch, features, Dim("time", min=16)], lengths=[2], lengths_dtype=torch.int64)]
    outputs = [TensorSpec("log_probs", [batch, Dim("frames"), classes], lengths=[1])]
    return inputs, outputs


def vocabulary(classes: int = 12):
    return [f"t{i}" for i in range(classes - 1)] + ["<blk>"]


class SpeakerNet(nn.Module):
    """fbank [N, T, 80] -> conv -> mean and std over time -> linear: an x-vector in miniature."""

    def __init__(self, dim: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv1d(80, 32, 5, padding=2)
        self.out = nn.Linear(64, dim)

    def forward(self, fbank: torch.Tensor):
        h = torch.relu(self.conv(fbank.transpose(1, 2)))
        return self.out(torch.cat([h.mean(-1), h.std(-1)], dim=-1))


def speaker_specs(dim: int = 16):
    return [TensorSpec("fbank", [Dim("batch"), Dim("time", min=8), 80])], [TensorSpec("embedding", [Dim("batch"), dim])]
