"""Fourier transforms written as real-valued matrix products.

Neither exporter writes complex tensors that ONNX Runtime runs correctly
(issue #13), so a complex value travels as two real tensors and every
transform is a product with cosine and sine tables:

* STFT: one strided ``conv1d`` whose kernels are the windowed table rows
  (frames and transform in one op, any length);
* ISTFT: one ``conv_transpose1d`` (inverse transform, synthesis window and
  overlap-add in one op), divided by the overlap-added squared window;
* ``fft``/``ifft``/``rfft``/``irfft``: a ``matmul`` on the last axis.

Each is exact up to float32 round-off of an ``N``-term dot product (the tables
are computed in float64 and rounded once). Table entries that are exactly 0 or
±1 in exact arithmetic are stored exactly, so the imaginary part of the DC and
Nyquist bins is exactly 0, as PyTorch's own FFT gives it, and ``angle`` there
does not jump by 2π.

The transform length is a Python int when it comes from an argument
(``n_fft``, ``n=``) or a static dim: the tables are constants then. A length
taken from a dynamic dim is a traced value: the tables are computed in the
graph from it.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

Pair = Tuple[torch.Tensor, torch.Tensor]


def _np_tables(n: int, bins: int) -> Tuple[np.ndarray, np.ndarray]:
    r = np.outer(np.arange(bins), np.arange(n)) % n  # exact integer phase index
    angle = 2.0 * np.pi * r / n
    cos, sin = np.cos(angle), np.sin(angle)
    sin[(2 * r) % n == 0] = 0.0  # phase 0 or π
    cos[((4 * r) % n == 0) & ((2 * r) % n != 0)] = 0.0  # phase π/2 or 3π/2
    return cos, sin


def tables(n, bins, like: torch.Tensor) -> Pair:
    """``cos(2π k t / n)`` and ``sin(...)``, ``[bins, n]``, in ``like``'s dtype and device."""
    if isinstance(n, int) and isinstance(bins, int):
        cos, sin = _np_tables(n, bins)
        with warnings.catch_warnings():  # constants indeed: "registered as constants in the trace"
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return (torch.from_numpy(cos).to(like.dtype).to(like.device),
                    torch.from_numpy(sin).to(like.dtype).to(like.device))
    k = torch.arange(bins, device=like.device)
    t = torch.arange(n, device=like.device)
    # n as a 0-d tensor: dynamo's ONNX translation of ``tensor % symbolic int`` fails (aten.remainder.Scalar)
    n = torch.ones((), dtype=torch.int64, device=like.device) * n
    r = (k[:, None] * t[None, :]) % n
    angle = r.to(like.dtype) * (2.0 * math.pi) / n.to(like.dtype)
    half, quarter = (2 * r) % n == 0, (4 * r) % n == 0
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    sin = torch.where(half, zero, torch.sin(angle))
    cos = torch.where(quarter & ~half, zero, torch.cos(angle))
    return cos, sin


def _scale(n, norm: Optional[str], inverse: bool):
    """The factor of ``torch.fft``'s ``norm=`` for a transform of length ``n``."""
    norm = norm or "backward"
    if norm == "ortho":
        return n ** -0.5
    if (norm == "backward") == inverse:
        return 1.0 / n
    return 1.0


def fit(x: torch.Tensor, n) -> torch.Tensor:
    """The last axis cut or zero-padded to ``n`` (the ``n=`` of ``torch.fft``)."""
    return F.pad(x, (0, n))[..., :n]


def onesided_weights(n, bins, like: torch.Tensor) -> torch.Tensor:
    """Hermitian weights of a one-sided spectrum: 1 for DC (and Nyquist if ``n`` is even), else 2."""
    k = torch.arange(bins, device=like.device)
    single = (k == 0) | (2 * k == n)
    return torch.where(single, 1.0, 2.0).to(like.dtype)


def rfft(x: torch.Tensor, n, norm: Optional[str]) -> Pair:
    """One-sided DFT of the last axis of a real ``x`` (already fitted to ``n``)."""
    cos, sin = tables(n, n // 2 + 1, x)
    s = _scale(n, norm, inverse=False)
    return (x @ cos.T) * s, (x @ sin.T) * -s


def irfft(re: torch.Tensor, im: torch.Tensor, n, norm: Optional[str]) -> torch.Tensor:
    """Real inverse of a one-sided spectrum (last axis ``n // 2 + 1`` bins, already fitted)."""
    bins = n // 2 + 1
    cos, sin = tables(n, bins, re)
    c = onesided_weights(n, bins, re)[:, None] * _scale(n, norm, inverse=True)
    return re @ (cos * c) - im @ (sin * c)


def fft(re: torch.Tensor, im: Optional[torch.Tensor], n, norm: Optional[str], inverse: bool) -> Pair:
    """Full DFT (or inverse) of the last axis; ``im`` None for a real input."""
    cos, sin = tables(n, n, re)
    s = _scale(n, norm, inverse)
    sign = 1.0 if inverse else -1.0  # e^{±iθ}
    out_re, out_im = re @ cos.T, (re @ sin.T) * sign
    if im is not None:
        out_re = out_re - (im @ sin.T) * sign
        out_im = out_im + im @ cos.T
    return out_re * s, out_im * s


def full_window(window: Optional[torch.Tensor], n_fft: int, win_length: int, like: torch.Tensor) -> torch.Tensor:
    """The window zero-padded to ``n_fft`` in the middle, as ``torch.stft`` places it."""
    if window is None:
        window = torch.ones(win_length, dtype=like.dtype, device=like.device)
    left = (n_fft - win_length) // 2
    return F.pad(window.to(like.dtype), (left, n_fft - win_length - left))


def stft(x: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor, center: bool, pad_mode: str,
         normalized: bool, onesided: bool, align_left: int = 0, align_right: int = 0) -> Pair:
    """``torch.stft`` of a real ``[S]`` or ``[B, S]`` signal: ``[(B,) bins, frames]`` real and imaginary parts.

    ``window`` is already ``n_fft`` long. ``align_left/right``: zero padding of
    ``align_to_window=True`` (frames follow the window, not ``n_fft``).
    """
    batched = x.dim() == 2
    signal = (x if batched else x[None]).unsqueeze(1)  # [B, 1, S]
    if center:
        signal = F.pad(signal, (n_fft // 2, n_fft // 2), mode=pad_mode)
    elif align_left or align_right:
        signal = F.pad(signal, (align_left, align_right))
    bins = n_fft // 2 + 1 if onesided else n_fft
    cos, sin = tables(n_fft, bins, x)
    kernel = torch.cat([cos * window, sin * -window], 0)
    if normalized:
        kernel = kernel * n_fft ** -0.5
    # a static reshape: the TorchScript exporter needs the kernel's shape known
    y = F.conv1d(signal, kernel.reshape(2 * bins, 1, n_fft), stride=hop)  # [B, 2 * bins, frames]
    re, im = y.split(bins, 1)
    return (re, im) if batched else (re[0], im[0])


def istft(re: torch.Tensor, im: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor, center: bool,
          normalized: bool, onesided: bool, length: Optional[int]) -> torch.Tensor:
    """``torch.istft`` to a real signal from ``[(B,) bins, frames]`` parts; ``window`` is ``n_fft`` long."""
    batched = re.dim() == 3
    if not batched:
        re, im = re[None], im[None]
    bins = n_fft // 2 + 1 if onesided else n_fft
    cos, sin = tables(n_fft, bins, re)
    c = onesided_weights(n_fft, bins, re)[:, None] if onesided else 1.0
    c = c * (n_fft ** -0.5 if normalized else 1.0 / n_fft)
    kernel = torch.cat([cos * c * window, sin * c * -window], 0)  # [2 * bins, n_fft]
    spectrum = torch.cat([re, im], 1)  # [B, 2 * bins, frames]
    y = F.conv_transpose1d(spectrum, kernel.reshape(2 * bins, 1, n_fft), stride=hop)[:, 0]  # [B, n_fft + hop * (frames - 1)]
    ones = torch.ones_like(re[:1, :1, :])  # [1, 1, frames]
    envelope = F.conv_transpose1d(ones, (window * window).reshape(1, 1, n_fft), stride=hop)[:, 0]
    start = n_fft // 2 if center else 0
    if length is not None:
        # istft pads zeros past the frames when ``length`` asks for more
        y = F.pad(y, (0, length))[:, start:start + length]
        envelope = F.pad(envelope, (0, length), value=1.0)[:, start:start + length]
    elif center:
        y, envelope = y[:, start:-start], envelope[:, start:-start]
    y = y / envelope
    return y if batched else y[0]
