"""Small models of what round five of the sweep found (docs/sweep.md): forms third-party models write that
neither exporter followed, each as such code writes it."""
from __future__ import annotations

import torch
import torch.nn as nn
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
