"""Models with their spectra inside ``forward``: the cases of the ``spectral`` patches.

* ``LogMelFrontend``: raw samples ``[B, S]`` and lengths in; log-mel features
  ``[B, T, 80]`` and frame lengths out (``torch.stft`` -> power -> mel matrix
  -> log), as ASR front-ends compute them.
* ``RawAudioConformer``: that front-end in front of the bundled Conformer, so
  one graph goes from samples to log-probs.
* ``IstftVocoder``: a Vocos-style head, mel ``[B, T, C]`` in, samples
  ``[B, S]`` out: convolutions predict log-magnitude and phase, the complex
  spectrum is ``mag * (cos(p) + 1j * sin(p))`` and ``torch.istft`` makes the
  waveform.

None of them knows about ONNX; they export because ``onnx_compat.patched()``
is active while the exporter traces them.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from onnx_compat.spec import Dim, TensorSpec
from onnx_compat.models.conformer import ConformerEncoder


def mel_filterbank(n_fft: int, mels: int, sample_rate: int, fmin: float = 0.0, fmax: float = None) -> np.ndarray:
    """Triangular filters on the HTK mel scale, ``[n_fft // 2 + 1, mels]``."""
    fmax = fmax or sample_rate / 2

    def to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def to_hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    edges = to_hz(np.linspace(to_mel(fmin), to_mel(fmax), mels + 2))
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    lower = (freqs[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])[None, :]
    upper = (edges[None, 2:] - freqs[:, None]) / (edges[2:] - edges[1:-1])[None, :]
    return np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)


class LogMelFrontend(nn.Module):
    """25 ms Hann windows every 10 ms at 16 kHz (``n_fft=512``, ``win_length=400``), 80 mels."""

    def __init__(self, n_fft: int = 512, win_length: int = 400, hop: int = 160, mels: int = 80,
                 sample_rate: int = 16000):
        super().__init__()
        self.n_fft, self.win_length, self.hop = n_fft, win_length, hop
        self.register_buffer("window", torch.hann_window(win_length), persistent=False)
        self.register_buffer("mel", torch.from_numpy(mel_filterbank(n_fft, mels, sample_rate)), persistent=False)

    def forward(self, samples: torch.Tensor, lengths: torch.Tensor):
        spec = torch.stft(samples, self.n_fft, self.hop, self.win_length, self.window, center=True,
                          pad_mode="reflect", return_complex=True)  # [B, F, T]
        power = spec.abs() ** 2
        feats = torch.log(torch.clamp(power.transpose(1, 2) @ self.mel, min=1e-10))  # [B, T, mels]
        return feats, torch.div(lengths, self.hop, rounding_mode="floor") + 1


class RawAudioConformer(nn.Module):
    def __init__(self, frontend: LogMelFrontend, encoder: ConformerEncoder):
        super().__init__()
        self.frontend, self.encoder = frontend, encoder

    def forward(self, samples: torch.Tensor, lengths: torch.Tensor):
        feats, lengths = self.frontend(samples, lengths)
        return self.encoder(feats, lengths)


class IstftVocoder(nn.Module):
    """Mel frames to samples: a small conv backbone and an ISTFT head (``S = (T - 1) * hop``)."""

    def __init__(self, mels: int = 80, dim: int = 64, n_fft: int = 256, hop: int = 64):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.backbone = nn.Sequential(nn.Conv1d(mels, dim, 7, padding="same"), nn.GELU(),
                                      nn.Conv1d(dim, dim, 7, padding=3), nn.GELU())
        self.head = nn.Linear(dim, n_fft + 2)
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)

    def forward(self, mel: torch.Tensor, lengths: torch.Tensor):
        x = self.head(self.backbone(mel.transpose(1, 2)).transpose(1, 2)).transpose(1, 2)  # [B, n_fft + 2, T]
        log_mag, phase = x.chunk(2, dim=1)
        mag = torch.exp(log_mag).clamp(max=100.0)
        spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        audio = torch.istft(spec, self.n_fft, self.hop, window=self.window, center=True)
        return audio, (lengths - 1) * self.hop


def _samples(name: str = "samples", min_size: int = 1600):
    return Dim(name, min=min_size, example=4000)


def frontend(seed: int = 0):
    """``data`` = samples ``[B, S]`` + ``data:size1`` -> log-mel ``[B, T, 80]`` + ``output:size1``."""
    torch.manual_seed(seed)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, _samples()], lengths=[1], values=(-1.0, 1.0))]
    outputs = [TensorSpec("output", [batch, Dim("frames"), 80], lengths=[1])]
    return {"model": LogMelFrontend().eval(), "inputs": inputs, "outputs": outputs}


def raw_conformer(classes: int = 12, seed: int = 0):
    """The tiny bundled Conformer behind the log-mel front-end: samples in, log-probs out."""
    torch.manual_seed(seed)
    encoder = ConformerEncoder(80, classes, dim=32, layers=2, heads=4, kernel=7)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, _samples()], lengths=[1], values=(-1.0, 1.0))]
    outputs = [TensorSpec("output", [batch, Dim("time_sub4"), classes], lengths=[1])]
    return {"model": RawAudioConformer(LogMelFrontend(), encoder).eval(), "inputs": inputs, "outputs": outputs}


def vocoder(mels: int = 80, seed: int = 0, **sizes):
    """Mel ``[B, T, 80]`` + lengths -> samples ``[B, S]`` + lengths, through ``torch.istft``."""
    torch.manual_seed(seed)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time", min=4), mels], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim("samples")], lengths=[1])]
    return {"model": IstftVocoder(mels, **sizes).eval(), "inputs": inputs, "outputs": outputs}
