"""Recurrent cells stepped by a Python loop over time, as users write them: TorchScript unrolls the loop at the
example's count, dynamo writes it as an ONNX ``Scan``. ``tests/test_sized_trace.py`` exports them through
``auto``; ``benchmarks/loops_first.py`` times ``auto`` on them with and without putting TorchScript off."""
import torch
from torch import nn


class SteppedCell(nn.Module):
    """A tanh cell stepped over ``range(x.size(1))``, its states stacked: x [B, T, 4] -> [B, T, 6]."""

    def __init__(self, features: int = 4, hidden: int = 6):
        super().__init__()
        self.hidden = hidden
        self.inp, self.rec = nn.Linear(features, hidden), nn.Linear(hidden, hidden)

    def forward(self, x):
        h, ys = torch.zeros(x.shape[0], self.hidden), []
        for t in range(x.size(1)):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
            ys.append(h)
        return torch.stack(ys, 1)


class UnboundGRU(nn.Module):
    """An ``nn.GRUCell`` over ``x.unbind(1)``, the last state and the states stacked: x [B, T, 4] ->
    ([B, T, 6], [B, 6])."""

    def __init__(self, features: int = 4, hidden: int = 6):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.GRUCell(features, hidden)

    def forward(self, x):
        h, ys = x.new_zeros(x.shape[0], self.hidden), []
        for x_t in x.unbind(1):
            h = self.cell(x_t, h)
            ys.append(h)
        return torch.stack(ys, 1), h


class TimeFirstCell(SteppedCell):
    """The same tanh cell over a time-first input, ``for x_t in x`` (x [T, B, 4] -> [T, B, 6]), as spiking-network
    and state-space code steps it: the loop runs over axis 0."""

    def forward(self, x):
        h, ys = x.new_zeros(x.shape[1], self.hidden), []
        for x_t in x:
            h = torch.tanh(self.inp(x_t) + self.rec(h))
            ys.append(h)
        return torch.stack(ys, 0)
