"""Small models of what round five of the sweep found (docs/sweep.md): forms third-party models write that
neither exporter followed, each as such code writes it."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.fft import next_fast_len


class FastLengthConvolution(nn.Module):
    """A damped exponential kernel as long as the sequence, applied by FFT at scipy's next fast length (Mega's
    multi-headed EMA: ``fast_len = next_fast_len(N + M - 1)``, then ``rfft(x, n=fast_len)``)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.decay = nn.Parameter(torch.linspace(0.3, 0.6, d))  # short memory: a frozen length errs far off only

    def forward(self, x):  # [B, T, D]
        T = x.shape[1]
        kernel = self.decay ** torch.arange(T, dtype=x.dtype)[:, None]  # [T, D]
        n = next_fast_len(2 * T - 1)
        spectrum = torch.fft.rfft(x, n=n, dim=1) * torch.fft.rfft(kernel, n=n, dim=0)
        return torch.fft.irfft(spectrum, n=n, dim=1)[:, :T]


class SizeReciprocal(nn.Module):
    """Attention scaled by the length's reciprocal, ``seq_len ** -1`` (Mega's Laplace attention function)."""

    def forward(self, x):  # [B, T, D]
        seq_len = x.shape[-2]
        sim = torch.einsum("bid,bjd->bij", x, x) * seq_len ** -1
        return torch.relu(sim) ** 2 @ x + x * seq_len ** -2


class BoundedTable(nn.Module):
    """A position table held for 100 steps, its slice's length read as a Python int (frozen by the trace, and
    right at every length it takes); past 100 steps the eager model itself refuses."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(0, 1, 100)[:, None].repeat(1, 8))

    def forward(self, x):
        n = int(x.shape[1])
        if n > self.table.shape[0]:
            raise ValueError(f"at most {self.table.shape[0]} steps")
        return x + self.table[:x.shape[1]]


def _pad_seq_to_multiple(t, mult):
    """simple-hierarchical-transformer's helper, as it is written: an early return where nothing is to pad."""
    seq_len = t.shape[-2]
    next_seq_len_mult = math.ceil(seq_len / mult) * mult
    remainder = next_seq_len_mult - seq_len
    if remainder == 0:
        return t, seq_len
    t = F.pad(t, (0, 0, 0, remainder), value=0.)
    return t, seq_len


class EarlyReturnPad(nn.Module):
    """A coarser hierarchy: time padded to a multiple of 2 (``_pad_seq_to_multiple``), pairs of frames averaged,
    spread back over the frames and cut to the input's length. At an even example the early return is the side
    traced."""

    def __init__(self, d: int = 8, mult: int = 2):
        super().__init__()
        self.mult, self.proj = mult, nn.Linear(d, d)

    def forward(self, x):  # [B, T, D]
        padded, n = _pad_seq_to_multiple(x, self.mult)
        b, t, d = padded.shape
        coarse = padded.reshape(b, t // self.mult, self.mult, d).mean(2)
        return x + self.proj(coarse.repeat_interleave(self.mult, dim=1)[:, :n])



class _Attend(nn.Module):
    """simple-hierarchical-transformer's ``Attend``: its causal mask in a non-persistent buffer, made again
    when a longer sequence comes."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", None, persistent=False)

    def get_mask(self, n, device):
        if self.mask is not None and self.mask.shape[-1] >= n:
            return self.mask[:n, :n]
        mask = torch.ones((n, n), device=device, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        return mask

    def forward(self, q, k, v):
        sim = (q @ k.transpose(-1, -2)).masked_fill(self.get_mask(q.shape[-2], q.device), -1e4)
        return sim.softmax(-1) @ v


class KeptCausalMask(nn.Module):
    """Attention whose mask cache (``_Attend``) a trace fills with a traced tensor."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.qkv, self.attend = nn.Linear(d, 3 * d), _Attend()

    def forward(self, x):  # [B, T, D]
        return self.attend(*self.qkv(x).chunk(3, dim=-1))
