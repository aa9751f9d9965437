"""The classic demo: 3x Conv1d(k=5, padding="same") over features with lengths.

Features ``[B, T, F]`` and int lengths ``[B]`` in; log-probs ``[B, T, C]`` and
the lengths (unchanged: stride 1, "same") out. Frames beyond a sequence's
length are masked to zero between layers, so padding never leaks into a
sequence.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat.spec import Dim, TensorSpec


class ConvDemo(nn.Module):
    def __init__(self, features: int = 40, hidden: int = 64, classes: int = 32, kernels=(5, 5, 5), dilations=(1, 1, 1)):
        super().__init__()
        dims = [features] + [hidden] * len(kernels)
        self.convs = nn.ModuleList(nn.Conv1d(i, o, k, padding="same", dilation=d)
                                   for i, o, k, d in zip(dims, dims[1:], kernels, dilations))
        self.out = nn.Linear(hidden, classes)

    def forward(self, data: torch.Tensor, lengths: torch.Tensor):
        mask = torch.arange(data.shape[1], device=data.device)[None, :] < lengths[:, None]  # [B, T]
        x = data.transpose(1, 2)  # [B, F, T]
        for conv in self.convs:
            x = torch.relu(conv(x)) * mask[:, None, :]
        return self.out(x.transpose(1, 2)).log_softmax(-1), lengths


def io_specs(features: int = 40, classes: int = 32):
    """The ONNX I/O of ``ConvDemo``: ``data``/``data:size1`` -> ``output``/``output:size1``."""
    batch, time = Dim("batch"), Dim("time", min=2)
    inputs = [TensorSpec("data", [batch, time, features], lengths=[1])]
    outputs = [TensorSpec("output", [batch, time, classes], lengths=[1])]
    return inputs, outputs


def build(features: int = 40, classes: int = 32, seed: int = 0):
    """A factory for the CLI: ``onnx-compat export onnx_compat.models.conv_demo:build``."""
    torch.manual_seed(seed)
    inputs, outputs = io_specs(features, classes)
    return {"model": ConvDemo(features, classes=classes).eval(), "inputs": inputs, "outputs": outputs}


def build_hard(features: int = 40, classes: int = 32, seed: int = 0):
    """The stack vanilla TorchScript export gets wrong: an even kernel (asymmetric
    "same") and dilations 2 and 3 (ONNX Runtime refuses auto_pad with dilation)."""
    torch.manual_seed(seed)
    inputs, outputs = io_specs(features, classes)
    model = ConvDemo(features, classes=classes, kernels=(4, 3, 4), dilations=(1, 2, 3)).eval()
    return {"model": model, "inputs": inputs, "outputs": outputs}
