"""Small models of round three's patterns, part f (issue #47): size guards true on the whole declared range
that torch cannot prove (a conv STFT's frames), a causal mask cached at the context length against a fresh
one, a log2(T) parallel scan, and complex linear algebra on an STFT. Written here for the pattern, not copied
from the libraries that showed it (clearvoice FRCRN, music2latent, xlstm, mambapy, nara-wpe)."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class FramedSpectrum(nn.Module):
    """A conv STFT (hop 32, window 64: ``frames = T // 32 - 1``), its real and imaginary halves stacked and
    moved to [B, frames, 2*bins], then reshaped per frame and back: the views ask torch whether
    ``2 % (2*(T//32) - 2) != 0`` and whether a ``Min(66, 66*(T//32) - 66)`` is its constant, true for every
    T >= 96 and not decided by torch's value ranges."""

    def __init__(self, bins: int = 33):
        super().__init__()
        self.bins = bins
        self.kernel = nn.Parameter(torch.randn(2 * bins, 1, 2 * (bins - 1)) * 0.1)
        self.mix = nn.Linear(2 * bins, 2 * bins)

    def forward(self, wave):                                   # [B, T]
        B = wave.shape[0]
        spec = F.conv1d(wave.unsqueeze(1), self.kernel, stride=self.bins - 1)    # [B, 2*bins, frames]
        real, imag = spec[:, :self.bins], spec[:, self.bins:]
        pairs = torch.stack([real, imag], 1).permute(0, 3, 1, 2).reshape(B, -1, 2 * self.bins)
        rows = pairs[:, :, None, :].expand(-1, -1, 1, -1).reshape(B * pairs.shape[1], 2 * self.bins)
        mixed = self.mix(rows).view(B, -1, 2 * self.bins)
        return mixed.transpose(1, 2).contiguous().view(B * 2 * self.bins, -1).view(B, 2 * self.bins, -1)


class CachedCausalMask(nn.Module):
    """Causal attention whose mask is a buffer at the context length, used as it is when the sequence is that
    long and made fresh (``tril(ones(S, S))``) when it is shorter: two branches that compute the same mask,
    chosen by ``S < buffer.size(-1)`` (xlstm's mLSTM backend)."""

    def __init__(self, context: int = 16, dim: int = 8):
        super().__init__()
        self.register_buffer("causal_mask", torch.tril(torch.ones(context, context, dtype=torch.bool)),
                             persistent=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):                                      # [B, S, dim], S <= context
        S = x.shape[1]
        mask = self.causal_mask
        if S < mask.size(-1):
            mask = torch.tril(torch.ones((S, S), dtype=torch.bool, device=x.device))
        scores = torch.where(mask, self.proj(x) @ x.transpose(1, 2), -1e4)
        return scores.softmax(-1) @ x


class HalvingScan(nn.Module):
    """``h[t] = a[t] * h[t-1] + x[t]``'s up-sweep over a length padded to the next power of two
    (``2 ** ceil(log2(T))``), one halving view per level (``log2(L)`` levels): the trip count and the pad
    width are Python numbers of the length."""

    def forward(self, a, x):                                   # [B, T, D]
        T = x.shape[1]
        L = 2 ** math.ceil(math.log2(T))
        a = F.pad(torch.sigmoid(a), (0, 0, 0, L - T)).transpose(1, 2).contiguous()
        x = F.pad(x, (0, 0, 0, L - T)).transpose(1, 2).contiguous()
        B, D, _ = x.shape
        aa, xx = a, x
        for _ in range(int(math.log2(L))):
            n = xx.size(2)
            aa, xx = aa.view(B, D, n // 2, 2), xx.view(B, D, n // 2, 2)
            xx[..., 1].add_(aa[..., 1] * xx[..., 0])
            aa[..., 1].mul_(aa[..., 0])
            aa, xx = aa[..., 1], xx[..., 1]
        return x.transpose(1, 2)[:, :T]


class ComplexSolveFilter(nn.Module):
    """A per-bin linear prediction on a complex STFT: the correlation matrix of delayed frames and a
    ``torch.linalg.solve`` for the filter (a WPE-like dereverberation), then the inverse STFT. ``solver``:
    ``"solve"``, ``"inv"`` (``torch.linalg.inv(R) @ P``), ``"det"`` (the correlation scaled by its determinant:
    complex linear algebra with no pair form). ``sign_first``: a complex call without a pair form
    (``torch.sgn``) before the linear algebra."""

    def __init__(self, taps: int = 2, solver: str = "solve", sign_first: bool = False):
        super().__init__()
        self.taps, self.solver, self.sign_first = taps, solver, sign_first

    def forward(self, wave):                                   # [B, T]
        window = torch.hann_window(64, device=wave.device)
        spec = torch.stft(wave, 64, 16, window=window, return_complex=True)      # [B, F, N]
        if self.sign_first:
            spec = spec + 1e-3 * torch.sgn(spec)
        delayed = torch.stack([torch.roll(spec, k + 1, -1) for k in range(self.taps)], -2)  # [B, F, K, N]
        corr = delayed @ delayed.conj().transpose(-1, -2) + 1e-3 * torch.eye(self.taps)
        cross = delayed @ spec.unsqueeze(-1).conj()
        if self.solver == "det":
            corr = corr / torch.linalg.det(corr)[..., None, None]
        filt = torch.linalg.inv(corr) @ cross if self.solver == "inv" else torch.linalg.solve(corr, cross)
        clean = spec - (filt.conj().transpose(-1, -2) @ delayed).squeeze(-2)
        return torch.istft(clean, 64, 16, window=window, length=wave.shape[-1])


class StridedPrediction(nn.Module):
    """nara-wpe's form of the same prediction (torch_wpe.build_y_tilde, wpe.segment_axis): the array library picked
    by the spectrum's class module, its rank read with ``ndimension()``, the frames padded on the left with a pad
    list built in numpy, then framed with ``as_strided`` at strides read with ``stride()``, and the filter solved
    per bin from the correlation of the delayed frames."""

    def __init__(self, taps: int = 3, delay: int = 1):
        super().__init__()
        self.taps, self.delay = taps, delay

    def forward(self, wave):                                   # [B, T]
        window = torch.hann_window(64, device=wave.device)
        spec = torch.stft(wave, 64, 16, window=window, return_complex=True)      # [B, F, N]
        xp = {"numpy": np, "torch": torch}[type(spec).__module__]
        pad = np.zeros([spec.ndimension(), 2], dtype=int)
        pad[-1, 0] = self.taps + self.delay - 1
        padded = F.pad(spec, pad[::-1].ravel().tolist()).contiguous()            # [B, F, N + taps + delay - 1]
        B, bins, frames = padded.shape
        s = list(padded.stride())
        windows = xp.as_strided(padded, size=(B, bins, frames - self.taps + 1, self.taps),
                                stride=(s[0], s[1], s[2], s[2]))                  # [B, F, N + delay, taps]
        delayed = windows[..., :-self.delay, :].transpose(-1, -2)                 # [B, F, taps, N]
        corr = delayed @ delayed.conj().transpose(-1, -2) + 1e-3 * torch.eye(self.taps)
        filt = torch.linalg.solve(corr, delayed @ spec.unsqueeze(-1).conj())     # [B, F, taps, 1]
        clean = spec - (filt.conj().transpose(-1, -2) @ delayed).squeeze(-2)
        return torch.istft(clean, 64, 16, window=window, length=wave.shape[-1])
