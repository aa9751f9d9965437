"""A unidirectional LSTM encoder that streams: its (h, c) are the states.

``forward(data)`` is the whole-utterance forward; ``streaming_forward(chunk,
h, c)`` is one call of the stream and returns the chunk's log-probs and the
next ``(h, c)``. Streamed chunk after chunk from zeros, it gives the full
forward's output (an LSTM is causal by construction).
"""
from __future__ import annotations

import torch
from torch import nn

from ..spec import Dim, TensorSpec


class LSTMEncoder(nn.Module):
    def __init__(self, features: int = 20, hidden: int = 32, layers: int = 2, classes: int = 12):
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.output = nn.Linear(hidden, classes)

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(torch.relu(self.input(data)))
        return self.output(y).log_softmax(-1)

    def streaming_forward(self, chunk: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        y, (h, c) = self.lstm(torch.relu(self.input(chunk)), (h, c))
        return self.output(y).log_softmax(-1), h, c


def streaming_job(features: int = 20, hidden: int = 32, layers: int = 2, classes: int = 12, chunk: int = 8,
                  seed: int = 0) -> dict:
    """A factory for ``onnx-compat export-streaming onnx_compat.models.lstm_encoder:streaming_job``."""
    from ..streaming import StateSpec
    torch.manual_seed(seed)
    model = LSTMEncoder(features, hidden, layers, classes).eval()
    batch = Dim("batch")
    return {
        "step": model.streaming_forward,
        "inputs": [TensorSpec("data", [batch, chunk, features])],
        "states": [StateSpec("h", [layers, batch, hidden]), StateSpec("c", [layers, batch, hidden])],
        "outputs": [TensorSpec("output", [batch, chunk, classes])],
        "full_forward": model,
    }
