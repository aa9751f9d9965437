"""The recurrent cases: an LSTM/GRU model with every option the recurrent patches handle (layers,
directions, batch-first or time-first, initial states, packed sequences, LSTMP), as ``PatchCase`` rows.
``tests/test_recurrent.py`` asserts its tables of them; ``benchmarks/op_tail.py`` and
``rewrite_latency.py`` measure the LSTMP case (``LSTMP``); neither imports the other."""
import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from onnx_compat.testing import GRAD_MODES, PatchCase

F_IN, HIDDEN = 6, 5


class Recurrent(nn.Module):
    """x [B, T, F] -> (y [B, T, D*H], h_n[, c_n]); time-first layers get x transposed."""

    def __init__(self, mode, layers, bidirectional, batch_first, initial_state, packed=False, proj=0):
        super().__init__()
        self.mode, self.batch_first, self.initial, self.packed = mode, batch_first, initial_state, packed
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        extra = {"proj_size": proj} if proj else {}
        self.rnn = cls(F_IN, HIDDEN, layers, batch_first=batch_first, bidirectional=bidirectional, **extra)
        self.states = layers * (2 if bidirectional else 1)
        self.init = nn.Linear(F_IN, HIDDEN)
        self.proj = proj

    def forward(self, x, lengths):
        hx = None
        if self.initial:  # states computed from the input: batch-dependent
            c0 = torch.tanh(self.init(x.mean(1)))[None].expand(self.states, -1, -1).contiguous()
            h0 = c0[..., :self.proj] if self.proj else c0  # LSTMP: h has the projected width
            hx = (h0, 0.5 * c0) if self.mode == "LSTM" else h0
        seq = x if self.batch_first else x.transpose(0, 1)
        if self.packed:
            seq = pack_padded_sequence(seq, lengths.cpu(), batch_first=self.batch_first, enforce_sorted=False)
        y, state = self.rnn(seq, hx)
        if self.packed:
            y, _ = pad_packed_sequence(y, batch_first=self.batch_first, total_length=x.shape[1])
        y = y if self.batch_first else y.transpose(0, 1)
        y = y.reshape(y.shape[0], y.shape[1], -1)  # a shape use after the RNN
        states = state if self.mode == "LSTM" else (state,)
        return (y,) + tuple(s.transpose(0, 1).reshape(x.shape[0], -1) for s in states)


def inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, F_IN, generator=g), lengths


def padded_frames_are_zero(got, expected, inputs):
    """As pad_packed_sequence gives them (a batch with a shorter sequence only)."""
    lengths = inputs[1]
    if len(lengths) > 1:
        assert lengths[1] < len(got[0][1]) and np.all(got[0][1, int(lengths[1]):] == 0), "padded frames are not 0"


def case_name(mode, layers, bidirectional, batch_first, initial_state, packed=False, proj=0):
    return "_".join([mode.lower() + ("p" if proj else ""), str(layers), "bi" if bidirectional else "uni",
                     "batch_first" if batch_first else "time_first"] + ["h0"] * initial_state + ["packed"] * packed)


def case(config, packed=False, proj=0, **options):
    """``config``: (mode, layers, bidirectional, batch_first, initial_state)."""
    if packed:
        options.setdefault("also", padded_frames_are_zero)
    return PatchCase(case_name(*config, packed=packed, proj=proj), lambda: Recurrent(*config, packed=packed, proj=proj),
                     inputs, {0: {0: "batch", 1: "time"}, 1: {0: "batch"}}, sizes=((1, 23), (4, 50), (2, 9)),
                     grad_mode=GRAD_MODES["grad"], **options)  # exported with autograd on, as a training script does


# LSTM(proj_size=3), 2 layers, bidirectional, batch-first: the case the benchmarks time
LSTMP = case(("LSTM", 2, True, True, False), proj=3)
