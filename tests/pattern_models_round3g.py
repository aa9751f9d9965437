"""Small models of round three's recurrent loops (issue #47 item 2, ``test_round3_fixes_d.py``): a cell stepped
by ``for i, x_t in enumerate(x.unbind(dim=0))`` over a time-first layout whose every step is written into
buffers made before the loop (``g[i] = gates``, ``states_all[:, i + 1] = states``: xlstm's vanilla sLSTM
backend, ``xlstm/blocks/slstm/src/vanilla/__init__.py:54``), and a per-direction loop ``for t in range(L)``
storing ``h[t, :, di, :] = h_t`` into a preallocated output (sru's naive CPU path, ``sru/ops.py:205-244``).

Kept out of the test module, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class StoredStepsCell(nn.Module):
    """A two-state cell over ``[T, B, D]`` (batch-first input transposed), each step's gates and state stored
    at the step's index into zero-filled buffers ``[T + 1, ...]`` / ``[2, T + 1, ...]``, the first state
    stored before the loop; returns every state, the last one and the gates."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.inp = nn.Linear(d, 2 * d)
        self.rec = nn.Linear(d, 2 * d, bias=False)

    def forward(self, x):
        x = self.inp(x).transpose(0, 1)
        T, B, D = x.shape[0], x.shape[1], x.shape[2] // 2
        states = x.new_zeros(2, B, D)
        g = x.new_zeros(T + 1, 2, B, D)
        states_all = x.new_zeros(2, T + 1, B, D)
        states_all[:, 0] = states
        R = self.rec.weight  # the recurrent weight a local, as xlstm passes R to its backend
        for i, x_t in enumerate(x.unbind(dim=0)):
            raw = x_t + states[0] @ R.t()
            gates = torch.stack((torch.sigmoid(raw[:, :D]), torch.tanh(raw[:, D:])))
            states = torch.stack((gates[0] * gates[1] + states[1] * 0.5, states[1] + gates[1]))
            g[i] = gates
            states_all[:, i + 1] = states
        return states_all[:, 1:].permute(2, 1, 0, 3), states[0], g[:T].transpose(0, 2)


class StoredByRange(nn.Module):
    """sru's naive recurrence: ``h = x.new_zeros(L, B, 2, d)``, an outer ``for di in range(2)`` of constant
    count, and inside ``for t in range(L)`` a carried ``c_prev`` whose step is stored by ``h[t, :, di, :] = h_t``."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, 2 * 2 * d)

    def forward(self, x):
        u = self.proj(x).transpose(0, 1)
        L, B = u.shape[0], u.shape[1]
        u = u.view(L, B, 2, 2, -1)
        h = u.new_zeros(L, B, 2, u.shape[-1])
        for di in range(2):
            c_prev = u[0, :, di, 0] * 0
            for t in range(L):
                forget = torch.sigmoid(u[t, :, di, 1])
                c_prev = u[t, :, di, 0] + (c_prev - u[t, :, di, 0]) * forget
                h[t, :, di, :] = torch.tanh(c_prev) * forget
        return h.transpose(0, 1).flatten(2)


class RecurrentStores(nn.Module):
    """Both loops on one input (one dynamo export checks both lifts): the sLSTM-like cell's states and gates,
    and the sru-like recurrence's output."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.cell, self.sru = StoredStepsCell(d), StoredByRange(d)

    def forward(self, x):
        states_all, last, gates = self.cell(x)
        return states_all, last, gates, self.sru(x)


def stabilised_pointwise(raw, states):
    """xlstm's sLSTM pointwise step (``slstm.py:8-37``): the stabiliser ``m`` starts as the input gate's
    pre-activation at the first step (every normaliser still 0) and is the running maximum after; the branch
    reads the state's value."""
    c, n, m = torch.unbind(states, dim=0)
    i_raw, f_raw, z_raw = torch.unbind(raw, dim=1)
    log_f_plus_m = m + torch.nn.functional.logsigmoid(f_raw)
    if torch.all(n == 0.0):
        m_new = i_raw
    else:
        m_new = torch.max(i_raw, log_f_plus_m)
    i_gate = torch.exp(i_raw - m_new)
    f_gate = torch.exp(log_f_plus_m - m_new)
    c_new = f_gate * c + i_gate * torch.tanh(z_raw)
    n_new = f_gate * n + i_gate
    return torch.stack((c_new, n_new, m_new)), c_new / n_new


POINTWISE = {"stabilised": stabilised_pointwise}  # xlstm passes its step through a registry, not a global name


class StabilisedCell(nn.Module):
    """An sLSTM-like cell over ``[B, T, D]``: the step function comes from a registry and is passed to the loop
    as an argument, as xlstm's ``slstm_forward(..., pointwise_forward=...)`` takes it."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.inp = nn.Linear(d, 3 * d)
        self.rec = nn.Linear(d, 3 * d, bias=False)

    def forward(self, x):
        return self.run(self.inp(x).transpose(0, 1), POINTWISE["stabilised"])

    def run(self, x, pointwise):
        T, B, D = x.shape[0], x.shape[1], x.shape[2] // 3
        states, ys = x.new_zeros(3, B, D), []
        for x_t in x.unbind(dim=0):
            raw = (x_t + self.rec(torch.tanh(states[0]))).view(B, 3, D)
            states, y = pointwise(raw, states)
            ys.append(y)
        return torch.stack(ys, dim=1), states[0]
