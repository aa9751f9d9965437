"""Small models of issue #47 items 2 and 3: Python loops over a dynamic dim (``test_loops.py``).

Each is written the way users write it: a recurrent cell stepped over time (``unbind(1)``, ``range(T)``), a
selective scan joined with ``cat``, a mask zeroed row by row over the batch, a scan over log2(T) levels.
"""
from __future__ import annotations

import math
from math import ceil, log2

import torch
import torch.nn as nn


class TanhCell(nn.Module):
    """A hand-written Elman cell."""

    def __init__(self, d_in: int = 8, hidden: int = 16):
        super().__init__()
        self.inp, self.rec = nn.Linear(d_in, hidden), nn.Linear(hidden, hidden)

    def forward(self, x_t, h):
        return torch.tanh(self.inp(x_t) + self.rec(h))


class UnbindRNN(nn.Module):
    """``for x_t in x.unbind(1)``: the state carried, each step's state stacked over time."""

    def __init__(self):
        super().__init__()
        self.cell = TanhCell()

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 16)
        outs = []
        for x_t in x.unbind(1):
            h = self.cell(x_t, h)
            outs.append(h)
        return torch.stack(outs, 1)


class TimeFirstRNN(nn.Module):
    """``for x_t in x`` over a time-first ``[T, B, F]`` input: iterating the tensor itself steps through dim 0,
    which here is time, not the batch."""

    def __init__(self):
        super().__init__()
        self.cell = TanhCell()

    def forward(self, x):
        h = x.new_zeros(x.shape[1], 16)
        outs = []
        for x_t in x:
            h = self.cell(x_t, h)
            outs.append(h)
        return torch.stack(outs)


class KeptStateNeuron(nn.Module):
    """A leaky neuron that keeps its membrane potential on itself, as snntorch's ``Leaky`` does (a buffer ``mem``,
    empty until the first step, assigned every step)."""

    def __init__(self, beta: float = 0.9):
        super().__init__()
        self.beta = beta
        self.register_buffer("mem", torch.zeros(0), persistent=False)

    def forward(self, x):
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.mem = self.beta * self.mem + x
        return self.mem


class KeptStateLoop(nn.Module):
    """A loop over time whose state lives on a module, not in the loop's variables (emptied first, so each call
    starts from rest)."""

    def __init__(self):
        super().__init__()
        self.fc, self.lif = nn.Linear(8, 16), KeptStateNeuron()

    def forward(self, x):
        self.lif.mem = torch.zeros(0)
        outs = []
        for t in range(x.size(1)):
            outs.append(self.lif(self.fc(x[:, t])))
        return torch.stack(outs, 1)


class SpikingNeuron(nn.Module):
    """snntorch's ``Leaky`` as it is written: the state passed in and returned, and kept on the module as well
    (``self.mem``, a reset term ``self.reset`` written before it is read), a spike by threshold."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta
        self.register_buffer("mem", torch.zeros(0), persistent=False)

    def forward(self, x, mem=None):
        if mem is not None:
            self.mem = mem
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.reset = (self.mem > 1.0).float()
        self.mem = self.beta * self.mem + x - self.reset
        return (self.mem > 1.0).float(), self.mem


class SpikingNet(nn.Module):
    """snntorch's tutorial network: two neurons stepped over time, their states also passed along."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 16)
        self.lif1, self.lif2 = SpikingNeuron(0.9), SpikingNeuron(0.8)

    def forward(self, x):
        mem1, mem2 = torch.zeros(0), torch.zeros(0)
        mems = []
        for x_t in x.unbind(1):
            spk1, mem1 = self.lif1(self.fc1(x_t) * 2.0, mem1)
            _, mem2 = self.lif2(self.fc2(spk1 + mem1), mem2)
            mems.append(mem2)
        return torch.stack(mems, 1)


class StateOnSelfLoop(nn.Module):
    """Older recurrent code: the loop itself keeps an LSTM cell's ``(h, c)`` on the model, ``self.state``."""

    def __init__(self):
        super().__init__()
        self.cell, self.out = nn.LSTMCell(8, 16), nn.Linear(16, 16)

    def forward(self, x):
        self.state = (x.new_zeros(x.shape[0], 16), x.new_zeros(x.shape[0], 16))
        ys = []
        for t in range(x.size(1)):
            self.state = self.cell(x[:, t], self.state)
            ys.append(self.out(self.state[0]))
        return torch.stack(ys, 1)


class CountingNeuron(KeptStateNeuron):
    """A neuron that also counts its steps in a Python int on itself: a scan's one traced step counts once."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        return super().forward(x)


class CountingLoop(KeptStateLoop):
    def __init__(self):
        super().__init__()
        self.lif = CountingNeuron()


class RangeLSTM(nn.Module):
    """``for t in range(x.size(1))`` with ``x[:, t]``: two carried states (an LSTM cell), a per-step output
    joined with ``cat``, and the final state used after the loop."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 12)
        self.gate = nn.Parameter(torch.randn(12))

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 12)
        c = torch.zeros_like(h)
        ys = []
        for t in range(x.size(1)):
            h, c = self.cell(x[:, t], (h, c))
            gated = h * torch.sigmoid(self.gate)
            ys.append(gated.unsqueeze(1))
        return torch.cat(ys, 1) + c.unsqueeze(1)


class RowMask(nn.Module):
    """A mask zeroed row by row over the batch: ``for i in range(B): mask[i, lengths[i]:] = 0``."""

    def forward(self, x, lengths):
        mask = torch.ones(x.shape[0], x.shape[1])
        for i in range(x.shape[0]):
            mask[i, lengths[i]:] = 0
        return torch.tanh(x) * mask[..., None]


class Log2Scan(nn.Module):
    """A parallel (Hillis-Steele) cumulative sum over ceil(log2 T) levels: the trip count is a function of T."""

    def forward(self, x):
        T = x.shape[1]
        y = x
        for k in range(math.ceil(math.log2(T))):
            d = 2 ** k
            y = y + nn.functional.pad(y[:, :-d], (0, 0, d, 0))
        return y


class PowerOfTwoPad(nn.Module):
    """Padding time to the next power of two (an FFT-friendly length), then a running sum cut back to T."""

    def forward(self, x):
        T = x.shape[1]
        n = 1 << (T - 1).bit_length()
        y = nn.functional.pad(x, (0, 0, 0, n - T))
        return y.cumsum(1)[:, :T]


class PowerOfTwoPadByName(nn.Module):
    """The same padding with ``math``'s functions imported by name (H-Transformer-1D: ``from math import log2,
    ceil``, then ``2 ** ceil(log2(n))``)."""

    def forward(self, x):
        T = x.shape[1]
        n = 2 ** ceil(log2(T))
        y = nn.functional.pad(x, (0, 0, 0, n - T))
        return y.cumsum(1)[:, :T]


class ScanRNN(nn.Module):
    """The loop of ``UnbindRNN`` written with torch's scan, as the refusals advise (its step returns the state
    twice: as the carry and, cloned, as the step's output)."""

    def __init__(self):
        super().__init__()
        self.cell = TanhCell()

    def forward(self, x):
        from torch._higher_order_ops.scan import scan

        def step(h, x_t):
            h = self.cell(x_t, h)
            return h, h.clone()

        _, ys = scan(step, x.new_zeros(x.shape[0], 16), x.transpose(0, 1))
        return ys.transpose(0, 1)
