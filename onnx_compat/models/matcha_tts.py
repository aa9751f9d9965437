"""A Matcha-TTS acoustic model and two vocoders (HiFi-GAN, Vocos), at a tiny size.

``MatchaTTS`` follows shivammehta25/Matcha-TTS's ``matcha/models/matcha_tts.py`` ``synthesise`` (as icefall's
``egs/ljspeech/TTS/matcha`` copies it): a text encoder (token embedding, transformer layers, ``proj_m`` for the
prior mean ``mu_x``, a duration predictor giving ``logw``), the length regulator (``ceil(exp(logw) *
length_scale)``, ``generate_path``), and the conditional flow-matching decoder ``CFM``: ``z = randn_like(mu) *
temperature`` integrated by a fixed number of Euler steps of ``estimator(x, mask, mu, t)`` from t=0 to 1, then the
mel de-normalised by the data statistics; with ``n_spks > 1`` the speaker embedding ``spk_emb`` is stacked on the
encoder's and the estimator's channels, as upstream does. Differences from upstream, at this size: the encoder's attention is
VITS's (``onnx_compat.models.vits.Encoder``) instead of rotary; the estimator is a small conv net with a sinusoidal
time embedding instead of the 1D U-Net with transformer blocks.

The graph sherpa-onnx loads (``MatchaGraph`` in ``onnx_compat/parts/sherpa_tts.py``) fixes the ODE steps.
``HifiGan`` is VITS's HiFi-GAN ``Generator`` on the mel (``[1, n_mels, T] -> [1, T * hop]``); ``Vocos`` a ConvNeXt
backbone with Vocos's ISTFT head returning magnitude, cos and sin ``[1, n_fft/2+1, T]`` (sherpa-onnx does the
inverse STFT itself; ``Vocos.waveform`` is PyTorch's, ``torch.istft`` with a Hann window, center=True).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .vits import DurationPredictor, Encoder, Generator, generate_path, sequence_mask


class TextEncoder(nn.Module):
    def __init__(self, n_vocab, n_feats, channels=32, filter_channels=64, n_heads=2, n_layers=2, spk_emb_dim=0):
        super().__init__()
        self.channels, self.spk_emb_dim = channels, spk_emb_dim
        self.emb = nn.Embedding(n_vocab, channels)
        nn.init.normal_(self.emb.weight, 0.0, channels ** -0.5)
        self.prenet = nn.Sequential(nn.Conv1d(channels, channels, 5, padding=2), nn.ReLU())
        width = channels + spk_emb_dim
        self.encoder = Encoder(width, filter_channels, n_heads, n_layers, kernel_size=3, window_size=None)
        self.proj_m = nn.Conv1d(width, n_feats, 1)
        self.proj_w = DurationPredictor(width, filter_channels, 3, 0.1)

    def forward(self, x, x_lengths, spks=None):
        x = self.emb(x) * math.sqrt(self.channels)
        x = torch.transpose(x, 1, -1)
        x_mask = torch.unsqueeze(sequence_mask(x_lengths, x.size(2)), 1).to(x.dtype)
        x = self.prenet(x) * x_mask
        if spks is not None:  # Matcha: the speaker embedding repeated along time, stacked on the channels
            x = torch.cat([x, spks.unsqueeze(-1).repeat(1, 1, x.shape[-1])], dim=1)
        x = self.encoder(x, x_mask)
        mu = self.proj_m(x) * x_mask
        logw = self.proj_w(x, x_mask)
        return mu, logw, x_mask


class Estimator(nn.Module):
    """The vector field ``v(x, mu, t)``: the current sample and the prior mean stacked, a time embedding added."""

    def __init__(self, n_feats, channels=32, spk_emb_dim=0):
        super().__init__()
        self.channels = channels
        self.time_mlp = nn.Sequential(nn.Linear(channels, channels), nn.SiLU(), nn.Linear(channels, channels))
        self.conv_in = nn.Conv1d(2 * n_feats + spk_emb_dim, channels, 3, padding=1)
        self.block = nn.Sequential(nn.Mish(), nn.Conv1d(channels, channels, 3, padding=1), nn.Mish(),
                                   nn.Conv1d(channels, channels, 3, padding=1))
        self.conv_out = nn.Conv1d(channels, n_feats, 1)

    def time_embedding(self, t):
        half = self.channels // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32) * (-math.log(10000.0) / (half - 1)))
        angles = 1000.0 * t.reshape(-1, 1) * freqs.unsqueeze(0)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(self, x, mask, mu, t, spks=None):
        stacked = [x, mu] if spks is None else [x, mu, spks.unsqueeze(-1).repeat(1, 1, x.shape[-1])]
        h = self.conv_in(torch.cat(stacked, dim=1) * mask)
        h = h + self.time_mlp(self.time_embedding(t)).unsqueeze(-1)
        h = h + self.block(h * mask)
        return self.conv_out(h * mask) * mask


class CFM(nn.Module):
    """Conditional flow matching's inference: Euler steps from noise to the mel (``solve_euler``)."""

    def __init__(self, n_feats, channels=32, spk_emb_dim=0):
        super().__init__()
        self.estimator = Estimator(n_feats, channels, spk_emb_dim)

    def forward(self, mu, mask, n_timesteps: int, temperature=1.0, spks=None):
        z = torch.randn_like(mu) * temperature
        t_span = torch.linspace(0, 1, n_timesteps + 1, device=mu.device)
        return self.solve_euler(z, t_span, mu, mask, spks)

    def solve_euler(self, x, t_span, mu, mask, spks=None):
        t, dt = t_span[0], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            x = x + dt * self.estimator(x, mask, mu, t, spks)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x


class MatchaTTS(nn.Module):
    """The acoustic model: token ids -> mel ``[1, n_feats, frames]`` (``synthesise``)."""

    def __init__(self, n_vocab, n_feats=20, channels=32, mel_mean=-5.0, mel_std=2.0, n_spks=1, spk_emb_dim=8):
        super().__init__()
        self.n_vocab, self.n_feats, self.n_speakers = n_vocab, n_feats, n_spks
        spk = spk_emb_dim if n_spks > 1 else 0
        if n_spks > 1:
            self.spk_emb = nn.Embedding(n_spks, spk_emb_dim)
        self.encoder = TextEncoder(n_vocab, n_feats, channels, spk_emb_dim=spk)
        self.decoder = CFM(n_feats, channels, spk)
        self.register_buffer("mel_mean", torch.tensor(mel_mean))
        self.register_buffer("mel_std", torch.tensor(mel_std))

    def synthesise(self, x, x_lengths, n_timesteps: int, temperature=1.0, spks=None, length_scale=1.0):
        if self.n_speakers > 1:
            spks = self.spk_emb(spks.long())
        mu_x, logw, x_mask = self.encoder(x, x_lengths, spks)
        w = torch.exp(logw) * x_mask
        w_ceil = torch.ceil(w) * length_scale
        y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()
        y_mask = sequence_mask(y_lengths, None).unsqueeze(1).to(x_mask.dtype)
        attn_mask = x_mask.unsqueeze(-1) * y_mask.unsqueeze(2)
        attn = generate_path(w_ceil, attn_mask.transpose(2, 3)).squeeze(1)  # [b, t_y, t_x]
        mu_y = torch.matmul(attn, mu_x.transpose(1, 2)).transpose(1, 2)
        decoder_outputs = self.decoder(mu_y, y_mask, n_timesteps, temperature, spks)
        return decoder_outputs * self.mel_std + self.mel_mean


class HifiGan(nn.Module):
    """HiFi-GAN on the mel: ``[1, n_mels, T] -> [1, T * 16]`` (VITS's ``Generator``)."""

    def __init__(self, n_mels=20, channels=32):
        super().__init__()
        self.n_mels = n_mels
        self.generator = Generator(n_mels, (3,), ((1, 3),), (4, 4), channels, (8, 8))

    def forward(self, mel):
        return self.generator(mel).squeeze(1)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim, intermediate):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate)
        self.pwconv2 = nn.Linear(intermediate, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class Vocos(nn.Module):
    """Vocos: mel -> (magnitude, cos, sin) of an STFT with ``n_fft``/``hop_length`` (``ISTFTHead`` without the
    inverse STFT, which sherpa-onnx computes)."""

    def __init__(self, n_mels=20, dim=32, n_fft=64, hop_length=16, layers=2):
        super().__init__()
        self.n_mels, self.n_fft, self.hop_length = n_mels, n_fft, hop_length
        self.embed = nn.Conv1d(n_mels, dim, 7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.ModuleList(ConvNeXtBlock(dim, 2 * dim) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim, eps=1e-6)
        self.out = nn.Linear(dim, n_fft + 2)

    def forward(self, mel):
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        x = self.out(self.final_norm(x.transpose(1, 2))).transpose(1, 2)
        log_mag, p = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(log_mag), max=1e2)
        return mag, torch.cos(p), torch.sin(p)

    def waveform(self, mel):
        """PyTorch's audio: the inverse STFT of ``mag * (cos + i sin)`` (Hann window, center=True)."""
        mag, x, y = self.forward(mel)
        window = torch.hann_window(self.n_fft)
        return torch.istft(torch.complex(mag * x, mag * y), self.n_fft, self.hop_length, self.n_fft, window,
                           center=True)


def tiny_matcha(n_vocab: int, n_feats: int = 20, seed: int = 0, duration_bias: float = 1.0,
                n_spks: int = 1) -> MatchaTTS:
    torch.manual_seed(seed)
    model = MatchaTTS(n_vocab, n_feats, n_spks=n_spks)
    with torch.no_grad():
        model.encoder.proj_w.proj.bias.fill_(duration_bias)
    return model.eval()


def tiny_vocoder(kind: str, n_mels: int = 20, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "hifigan":
        model = HifiGan(n_mels)
        with torch.no_grad():
            model.generator.conv_post.weight.mul_(3.0)
        return model.eval()
    return Vocos(n_mels).eval()
