"""Small models of speechbrain's forms (``speechbrain/nnet/RNN.py``'s ``LiGRU_Layer``, ``speechbrain/nnet/pooling.py``'s
``StatisticsPooling``), issue #47 round one.

A bidirectional layer stacks the reversed sequence under the batch (``torch.cat([x, x.flip(1)], dim=0)``), runs
one recurrence over the ``2 * B`` rows and cuts them apart again with ``h.chunk(2, dim=0)``; its step multiplies by a
``[1]`` buffer read before the loop (LiGRU's test-time dropout mask, ``drop_mask_te``). Statistics pooling loops over
the batch with no state, each item's mean and standard deviation over its own length, read from a relative length
as a Python int.
"""
import torch
from torch import nn


class StackedDirections(nn.Module):
    """Both directions as one batch of ``2 * B`` rows, cut apart with ``chunk(2, dim=0)`` (no loop)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # [B, T, D]
        both = torch.cat([x, x.flip(1)], dim=0)
        h = torch.tanh(self.proj(both)).cumsum(1)
        forward, backward = h.chunk(2, dim=0)
        return torch.cat([forward, backward.flip(1)], dim=2)


class MaskedLiGRU(nn.Module):
    """LiGRU's recurrence as its layer writes it: ``w`` for every step computed before the loop, ``h`` started from
    a parameter broadcast to the rows, a ``[1]`` mask buffer read before the loop and multiplied in each step,
    both directions stacked under the batch and cut apart with ``chunk``."""

    def __init__(self, d: int = 8, hidden: int = 16):
        super().__init__()
        self.w = nn.Linear(d, 2 * hidden)
        self.u = nn.Linear(hidden, 2 * hidden, bias=False)
        self.h_init = nn.Parameter(torch.randn(1, hidden) * 0.1)
        self.register_buffer("drop_mask_te", torch.tensor([1.0]))

    def forward(self, x):  # [B, T, D] -> [B, T, 2 * hidden]
        x = torch.cat([x, x.flip(1)], dim=0)
        w = self.w(x)
        h = self._cell(w, self.h_init.broadcast_to(w.shape[0], self.h_init.shape[1]))
        h_f, h_b = h.chunk(2, dim=0)
        return torch.cat([h_f, h_b.flip(1)], dim=2)

    def _cell(self, w, ht):
        hiddens = []
        drop_mask = self.drop_mask_te
        for k in range(w.shape[1]):
            gates = w[:, k] + self.u(ht)
            at, zt = gates.chunk(2, 1)
            zt = torch.sigmoid(zt)
            hcand = torch.relu(at) * drop_mask
            ht = zt * ht + (1 - zt) * hcand
            hiddens.append(ht)
        return torch.stack(hiddens, dim=1)


class ItemStatistics(nn.Module):
    """Per-item mean and standard deviation over each item's frames, in a loop over the batch that carries
    nothing (speechbrain's ``StatisticsPooling`` with relative lengths): ``int(torch.round(lengths[i] * T))``,
    each statistic appended under a flag of the module (``if self.return_mean:``), the loop in the ``else:`` of
    ``if lengths is None:`` as speechbrain writes it."""

    def __init__(self, return_mean: bool = True, return_std: bool = True):
        super().__init__()
        self.return_mean, self.return_std = return_mean, return_std

    def forward(self, x, lengths=None):  # x [B, T, D], lengths in (0, 1] -> [B, D] or [B, 2 * D]
        if lengths is None:  # the loop stands in an else:, its lists stacked beside it, read after the if
            mean, std = x.mean(dim=1), x.std(dim=1)
        else:
            mean, std = [], []
            for snt_id in range(x.shape[0]):
                actual_size = int(torch.round(lengths[snt_id] * x.shape[1]))
                if self.return_mean:
                    mean.append(torch.mean(x[snt_id, 0:actual_size, ...], dim=0))
                if not self.return_std:
                    pass
                else:
                    std.append(torch.std(x[snt_id, 0:actual_size, ...], dim=0))
            if self.return_mean:
                mean = torch.stack(mean)
            if self.return_std:
                std = torch.stack(std)
        return torch.cat([mean, std], dim=1) if self.return_mean and self.return_std else \
            mean if self.return_mean else std


class _MeanOverLengths(nn.Module):
    def forward(self, x, lengths=None):  # [B, T, D] -> [B, D]
        return x.mean(1) if lengths is None else x.sum(1) / lengths[:, None]


class TriesWithLengths(nn.Module):
    """Each layer tried with the lengths first and called without them where it takes none (speechbrain's
    ``Xvector.forward``: ``try: x = layer(x, lengths=lens) except TypeError: x = layer(x)``)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(d, d), nn.LeakyReLU(), _MeanOverLengths(), nn.Linear(d, d)])

    def forward(self, x, lens):
        for layer in self.blocks:
            try:
                x = layer(x, lengths=lens)
            except TypeError:
                x = layer(x)
        return x
