"""A BLSTM acoustic model, the hybrid-ASR workhorse that RASR's feature scorer runs.

Features ``[B, T, F]`` and lengths ``[B]`` in; log-probs ``[B, T, C]`` and the
lengths (unchanged) out. The recurrent stack reads packed sequences, as
training code does, so padding never reaches a valid frame and the backward
direction starts at each sequence's own end. ``pad_packed_sequence(...,
total_length=T)`` keeps the output as long as the input.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from onnx_compat.spec import Dim, TensorSpec


class BLSTM(nn.Module):
    def __init__(self, features: int = 40, hidden: int = 64, layers: int = 2, classes: int = 32,
                 dropout: float = 0.1):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True, bidirectional=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.output = nn.Linear(2 * hidden, classes)

    def forward(self, data: torch.Tensor, lengths: torch.Tensor):
        packed = pack_padded_sequence(data, lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, _ = self.lstm(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=data.shape[1])
        return self.output(y).log_softmax(-1), lengths


def io_specs(features: int = 40, classes: int = 32):
    batch, time = Dim("batch"), Dim("time")
    inputs = [TensorSpec("data", [batch, time, features], lengths=[1])]
    outputs = [TensorSpec("output", [batch, time, classes], lengths=[1])]
    return inputs, outputs


def build(features: int = 40, classes: int = 32, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A factory for the CLI: ``onnx-compat export onnx_compat.models.blstm:build``."""
    torch.manual_seed(seed)
    inputs, outputs = io_specs(features, classes)
    return {"model": BLSTM(features, hidden, layers, classes).eval(), "inputs": inputs, "outputs": outputs}
