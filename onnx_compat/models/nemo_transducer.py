"""A small NeMo transducer (RNN-T or TDT), written the way NeMo writes one, for sherpa-onnx's NeMo loader.

NeMo itself cannot be installed here, so this module keeps the structure of its classes and the attributes a
converter reads (NVIDIA/NeMo ``nemo/collections/asr/modules/conformer_encoder.py``, ``rnnt.py``,
``parts/preprocessing/features.py``):

- ``AudioToMelSpectrogramPreprocessor`` with a ``featurizer`` (``FilterbankFeatures``): NeMo's front end --
  pre-emphasis 0.97, ``torch.stft`` with ``center=True`` and a symmetric Hann window of 400 samples in an n_fft of
  512, power spectrum, librosa's Slaney mel banks 0 Hz .. Nyquist, ``log(x + 2**-24)``, ``per_feature``
  normalisation with the unbiased std -- returning ``[B, C, T]`` and the frame counts.
- ``ConformerEncoder``: ``forward(audio_signal [B, C, T], length) -> (outputs [B, D, T'], encoded_lengths)``,
  channels first as NeMo's; a striding ``ConvSubsampling`` (factor 4) and Conformer layers (macaron feed-forward,
  masked self-attention, the convolution module with its padding masked, BatchNorm). Unlike NeMo's, the
  subsampling masks each stage's padded frames, so an utterance in a padded batch encodes as it does alone.
- ``RNNTDecoder``: ``prediction = {"embed": Embedding(V + 1, H, padding_idx=V), "dec_rnn": LSTM}`` with
  ``blank_as_pad`` (the blank, id V, embeds as zeros: it is the start symbol); ``forward(targets [B, U],
  target_length, states=[h, c]) -> (g [B, H, U], target_length, [h, c])``, a zero start symbol prepended unless
  ``_rnnt_export`` (set by ``_prepare_for_export``), as NeMo's.
- ``RNNTJoint``: ``enc`` and ``pred`` projections, ``joint_net`` (ReLU, Linear to ``V + 1 + num_extra_outputs``);
  ``forward(encoder_outputs [B, D, T], decoder_outputs [B, H, U]) -> [B, T, U, V + 1 (+ K)]`` (log-softmax on CPU,
  NeMo's automatic choice). TDT: ``num_extra_outputs`` duration logits after the tokens'.

``EncDecRNNTBPEModel`` holds them with ``cfg`` (a dict shaped as NeMo's config: ``preprocessor``,
``model_defaults.tdt_durations``).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import nn


def _slaney_mel(hz):
    """librosa's ``hz_to_mel(htk=False)``: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / (200.0 / 3)
    log = hz >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _slaney_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * (200.0 / 3)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), hz)


def librosa_mel(rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: Optional[float] = None) -> np.ndarray:
    """``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm="slaney")``: ``[n_mels, n_fft//2 + 1]``."""
    fmax = rate / 2 if fmax is None else fmax
    freqs = np.linspace(0, rate / 2, 1 + n_fft // 2)
    edges = _slaney_hz(np.linspace(_slaney_mel(fmin), _slaney_mel(fmax), n_mels + 2))
    widths, ramps = np.diff(edges), edges[:, None] - freqs[None, :]
    lower, upper = -ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return (weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


class FilterbankFeatures(nn.Module):
    """NeMo's ``FilterbankFeatures`` at its defaults (dither off: NeMo dithers in training only; ``pad_to`` 0)."""

    def __init__(self, sample_rate: int = 16000, n_window_size: int = 400, n_window_stride: int = 160,
                 nfilt: int = 80, normalize: str = "per_feature", preemph: float = 0.97, lowfreq: float = 0.0,
                 highfreq: Optional[float] = None, log_zero_guard_value: float = 2 ** -24):
        super().__init__()
        self.sample_rate, self.win_length, self.hop_length = sample_rate, n_window_size, n_window_stride
        self.n_fft = 2 ** math.ceil(math.log2(n_window_size))
        self.nfilt, self.normalize, self.preemph, self.guard = nfilt, normalize, preemph, log_zero_guard_value
        self.register_buffer("window", torch.hann_window(n_window_size, periodic=False))
        self.register_buffer("fb", torch.from_numpy(librosa_mel(sample_rate, self.n_fft, nfilt, lowfreq, highfreq)))

    def get_seq_len(self, length: torch.Tensor) -> torch.Tensor:
        return torch.div(length + 2 * (self.n_fft // 2) - self.n_fft, self.hop_length, rounding_mode="floor") + 1

    def forward(self, x: torch.Tensor, length: torch.Tensor):
        """``[B, samples]`` in [-1, 1], ``[B]`` -> ``[B, nfilt, T]``, ``[B]``."""
        seq_len = self.get_seq_len(length)
        if self.preemph:
            x = torch.cat((x[:, :1], x[:, 1:] - self.preemph * x[:, :-1]), dim=1)
        spec = torch.stft(x, self.n_fft, self.hop_length, self.win_length, self.window, center=True,
                          pad_mode="constant", return_complex=True)
        x = torch.log(torch.matmul(self.fb, spec.abs() ** 2) + self.guard)
        if self.normalize == "per_feature":
            x = _per_feature(x, seq_len)
        mask = torch.arange(x.shape[-1])[None, :] >= seq_len[:, None]
        return x.masked_fill(mask[:, None, :], 0.0), seq_len


def _per_feature(x: torch.Tensor, seq_len: torch.Tensor) -> torch.Tensor:
    """NeMo's ``normalize_batch(..., "per_feature")``: mean and unbiased std over the valid frames, + 1e-5."""
    out = torch.empty_like(x)
    for i, n in enumerate(seq_len.tolist()):
        valid = x[i, :, :n]
        mean, std = valid.mean(-1, keepdim=True), valid.std(-1, keepdim=True)
        out[i] = (x[i] - mean) / (std + 1e-5)
    return out


class AudioToMelSpectrogramPreprocessor(nn.Module):
    def __init__(self, features: int = 80, normalize: str = "per_feature"):
        super().__init__()
        self.featurizer = FilterbankFeatures(nfilt=features, normalize=normalize)

    def forward(self, input_signal: torch.Tensor, length: torch.Tensor):
        with torch.no_grad():
            return self.featurizer(input_signal, length)


def _time_mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """``[B, frames]``: True on the valid frames."""
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]


class ConvSubsampling(nn.Module):
    """NeMo's ``striding`` subsampling: ``log2(factor)`` Conv2d(3, stride 2, pad 1) + ReLU over ``[B, 1, T, F]``,
    then a Linear of the flattened channels; each stage's padded frames zeroed (see the module docstring)."""

    def __init__(self, feat_in: int, feat_out: int, subsampling_factor: int = 4, conv_channels: int = 8):
        super().__init__()
        self.stages = int(math.log2(subsampling_factor))
        self.conv = nn.ModuleList(nn.Conv2d(1 if i == 0 else conv_channels, conv_channels, 3, 2, 1)
                                  for i in range(self.stages))
        freq = feat_in
        for _ in range(self.stages):
            freq = (freq - 1) // 2 + 1
        self.out = nn.Linear(conv_channels * freq, feat_out)

    def calc_length(self, lengths: torch.Tensor) -> torch.Tensor:
        for _ in range(self.stages):
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
        return lengths.to(dtype=torch.int)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """``[B, T, F]``, ``[B]`` -> ``[B, T', D]``, ``[B]`` int32."""
        x = x.unsqueeze(1)
        for conv in self.conv:
            x = torch.relu(conv(x))
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
            x = x * _time_mask(lengths, x.shape[2])[:, None, :, None].to(x.dtype)
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths.to(dtype=torch.int)


class ConformerFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(torch.nn.functional.silu(self.linear1(x)))


class MultiHeadAttention(nn.Module):
    """NeMo's masked attention: scores of padded keys filled with -10000, their weights zeroed after the softmax."""

    def __init__(self, n_head: int, n_feat: int):
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q, self.linear_k = nn.Linear(n_feat, n_feat), nn.Linear(n_feat, n_feat)
        self.linear_v, self.linear_out = nn.Linear(n_feat, n_feat), nn.Linear(n_feat, n_feat)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (lin(x).view(b, t, self.h, self.d_k).transpose(1, 2)
                   for lin in (self.linear_q, self.linear_k, self.linear_v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        masked = pad_mask[:, None, None, :]
        attn = torch.softmax(scores.masked_fill(masked, -10000.0), dim=-1).masked_fill(masked, 0.0)
        return self.linear_out(torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.h * self.d_k))


class ConformerConvolution(nn.Module):
    def __init__(self, d_model: int, kernel_size: int):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model)
        self.batch_norm = nn.BatchNorm1d(d_model)
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        x = nn.functional.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        x = x.masked_fill(pad_mask[:, None, :], 0.0)
        x = nn.functional.silu(self.batch_norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, kernel_size: int):
        super().__init__()
        self.norm_feed_forward1, self.feed_forward1 = nn.LayerNorm(d_model), ConformerFeedForward(d_model, 2 * d_model)
        self.norm_self_att, self.self_attn = nn.LayerNorm(d_model), MultiHeadAttention(n_heads, d_model)
        self.norm_conv, self.conv = nn.LayerNorm(d_model), ConformerConvolution(d_model, kernel_size)
        self.norm_feed_forward2, self.feed_forward2 = nn.LayerNorm(d_model), ConformerFeedForward(d_model, 2 * d_model)
        self.norm_out = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pad_mask)
        x = x + self.conv(self.norm_conv(x), pad_mask)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class ConformerEncoder(nn.Module):
    """``forward(audio_signal [B, C, T], length [B]) -> (outputs [B, D, T'], encoded_lengths [B] int32)``."""

    def __init__(self, feat_in: int = 80, n_layers: int = 2, d_model: int = 32, subsampling_factor: int = 4,
                 n_heads: int = 2, conv_kernel_size: int = 5):
        super().__init__()
        self._feat_in, self._feat_out, self.subsampling_factor = feat_in, d_model, subsampling_factor
        self.pre_encode = ConvSubsampling(feat_in, d_model, subsampling_factor)
        self.layers = nn.ModuleList(ConformerLayer(d_model, n_heads, conv_kernel_size) for _ in range(n_layers))

    def forward(self, audio_signal: torch.Tensor, length: torch.Tensor):
        x, length = self.pre_encode(audio_signal.transpose(1, 2), length)
        pad_mask = ~_time_mask(length, x.shape[1])
        for layer in self.layers:
            x = layer(x, pad_mask)
        return x.transpose(1, 2), length


class RNNTDecoder(nn.Module):
    """NeMo's LSTM prediction network; ``blank_idx`` = V, embedded as zeros with ``blank_as_pad``."""

    def __init__(self, vocab_size: int, pred_hidden: int = 32, pred_rnn_layers: int = 1, blank_as_pad: bool = True):
        super().__init__()
        self.vocab_size, self.pred_hidden, self.pred_rnn_layers = vocab_size, pred_hidden, pred_rnn_layers
        self.blank_idx, self.blank_as_pad = vocab_size, blank_as_pad
        embed = nn.Embedding(vocab_size + 1, pred_hidden, padding_idx=self.blank_idx) if blank_as_pad else \
            nn.Embedding(vocab_size, pred_hidden)
        self.prediction = nn.ModuleDict({"embed": embed, "dec_rnn": nn.LSTM(pred_hidden, pred_hidden,
                                                                            pred_rnn_layers)})
        self._rnnt_export = False

    def predict(self, y: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, add_sos: bool = True):
        """``y`` ``[B, U]`` labels -> ``g`` ``[B, U (+ 1), H]`` and the next ``[h, c]`` ``[layers, B, H]``; with
        ``add_sos`` a zero "start" embedding is prepended (training), not when exported."""
        y = self.prediction["embed"](y.long())
        if add_sos:
            y = torch.cat([torch.zeros_like(y[:, :1]), y], dim=1)
        g, (h, c) = self.prediction["dec_rnn"](y.transpose(0, 1), None if state is None else (state[0], state[1]))
        return g.transpose(0, 1), [h, c]

    def _prepare_for_export(self, **kwargs):
        self._rnnt_export = True

    def forward(self, targets: torch.Tensor, target_length: torch.Tensor, states=None):
        """NeMo's: ``(g [B, H, U], target_length, [h, c])``, the start symbol added unless exporting."""
        g, state = self.predict(targets, state=states, add_sos=not self._rnnt_export)
        return g.transpose(1, 2), target_length, state


class RNNTJoint(nn.Module):
    def __init__(self, vocabulary: Sequence[str], encoder_hidden: int = 32, pred_hidden: int = 32,
                 joint_hidden: int = 48, num_extra_outputs: int = 0, log_softmax: Optional[bool] = None):
        super().__init__()
        self.vocabulary = list(vocabulary)
        self.num_classes_with_blank = len(self.vocabulary) + 1
        self.num_extra_outputs, self.log_softmax = num_extra_outputs, log_softmax
        self.enc, self.pred = nn.Linear(encoder_hidden, joint_hidden), nn.Linear(pred_hidden, joint_hidden)
        self.joint_net = nn.Sequential(nn.ReLU(), nn.Linear(joint_hidden, self.num_classes_with_blank +
                                                            num_extra_outputs))

    def joint(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``f`` ``[B, T, D]``, ``g`` ``[B, U, H]`` -> ``[B, T, U, V + 1 (+ K)]``."""
        res = self.joint_net(self.enc(f).unsqueeze(2) + self.pred(g).unsqueeze(1))
        if self.log_softmax or (self.log_softmax is None and not res.is_cuda):
            res = res.log_softmax(dim=-1)
        return res

    def forward(self, encoder_outputs: torch.Tensor, decoder_outputs: torch.Tensor) -> torch.Tensor:
        return self.joint(encoder_outputs.transpose(1, 2), decoder_outputs.transpose(1, 2))


class EncDecRNNTBPEModel(nn.Module):
    """The NeMo model's parts and its ``cfg``; TDT when ``cfg["model_defaults"]["tdt_durations"]`` is set."""

    def __init__(self, vocabulary: Sequence[str], features: int = 80, durations: Sequence[int] = (),
                 normalize: str = "per_feature", d_model: int = 32, pred_hidden: int = 32, pred_rnn_layers: int = 1):
        super().__init__()
        self.cfg = {"preprocessor": {"features": features, "normalize": normalize, "window": "hann",
                                     "sample_rate": 16000},
                    "model_defaults": {"tdt_durations": list(durations)} if durations else {}}
        self.preprocessor = AudioToMelSpectrogramPreprocessor(features, normalize)
        self.encoder = ConformerEncoder(features, d_model=d_model)
        self.decoder = RNNTDecoder(len(vocabulary), pred_hidden, pred_rnn_layers)
        self.joint = RNNTJoint(vocabulary, d_model, pred_hidden, num_extra_outputs=len(durations))


def vocabulary(size: int = 15) -> List[str]:
    """SentencePiece-like pieces, as ``joint.vocabulary`` holds them (no blank)."""
    return ["<unk>"] + [("▁" if i % 3 == 0 else "") + chr(ord("a") + i) for i in range(size - 1)]


def _centred(model: EncDecRNNTBPEModel, scale: float) -> None:
    """The joint's encoder projection centred and scaled on a calibration utterance (not a test one): a random
    encoder's frames differ little from their mean, so without this every frame votes alike."""
    from ..contracts.frontends import utterances
    samples = utterances((2.0,), seed=99)[0]
    signal, length = model.preprocessor(torch.from_numpy(samples)[None], torch.tensor([samples.size]))
    out, _ = model.encoder(signal, length)
    mean, std = out[0].mean(1), out[0].std(1)
    model.joint.enc.weight.mul_(scale / std.clamp(min=float(std.mean()))[None, :])  # no channel blown up
    model.joint.enc.bias.copy_(-model.joint.enc.weight @ mean)


def _no_repeats(model: EncDecRNNTBPEModel) -> None:
    """The prediction network remembers its tokens (each embeds as a one-hot; the LSTM's cell keeps half of the
    last) and the joint spends ``V`` of its hidden units penalising the last two tokens emitted: an untrained
    RNN-T otherwise emits the frame's favourite ten times per frame, while this one emits a varied sequence and
    the blank between (its decisions depend on the carried LSTM state: with zero states it decodes otherwise)."""
    decoder, joint, classes = model.decoder, model.joint, model.joint.num_classes_with_blank
    lstm, hidden, vocab = decoder.prediction["dec_rnn"], decoder.pred_hidden, decoder.vocab_size
    decoder.prediction["embed"].weight.zero_()
    decoder.prediction["embed"].weight[:vocab, :vocab] = torch.eye(vocab)
    lstm.weight_ih_l0.mul_(0.3)
    lstm.weight_ih_l0[2 * hidden:3 * hidden, :vocab] += 3 * torch.eye(hidden)[:, :vocab]
    lstm.bias_ih_l0.zero_()
    lstm.bias_hh_l0.zero_()
    lstm.bias_ih_l0[:hidden] = 6.0  # input gate open, forget gate at 0.5, output gate open
    lstm.bias_ih_l0[3 * hidden:] = 6.0
    width = joint.enc.out_features
    units = torch.arange(width - classes, width - 1)  # one per token
    joint.enc.weight[units] = 0
    joint.enc.bias[units] = 0
    joint.pred.weight[units] = 0
    joint.pred.weight[units, torch.arange(vocab)] = 20.0
    joint.pred.bias[units] = -6.0  # the last two tokens' units pass the ReLU, older ones not
    out = joint.joint_net[-1]
    out.weight[:, units] = 0
    out.weight[torch.arange(vocab), units] = -10.0


def _lively(model: EncDecRNNTBPEModel, scale: float, blank: float) -> EncDecRNNTBPEModel:
    """Weights a random init would not have, so an untrained tiny model decodes varied tokens, several per
    utterance, with blanks between (and, TDT, varied durations)."""
    with torch.no_grad():
        model.eval()
        _centred(model, scale)
        if not model.joint.num_extra_outputs:
            _no_repeats(model)
        out = model.joint.joint_net[-1]
        out.bias.zero_()
        out.bias[model.joint.num_classes_with_blank - 1] = blank
    return model


def rnnt(features: int = 80, seed: int = 0) -> EncDecRNNTBPEModel:
    """A tiny NeMo RNN-T (Conformer encoder, 1-layer LSTM prediction network), in eval mode."""
    torch.manual_seed(seed)
    return _lively(EncDecRNNTBPEModel(vocabulary(), features), 4.0, 0.5)


def tdt(features: int = 128, durations: Sequence[int] = (0, 1, 2, 3, 4), seed: int = 1) -> EncDecRNNTBPEModel:
    """A tiny NeMo TDT (parakeet-tdt's durations 0..4, 128 mel bins as parakeet-tdt-0.6b), 2 LSTM layers."""
    torch.manual_seed(seed)
    return _lively(EncDecRNNTBPEModel(vocabulary(), features, durations, pred_rnn_layers=2), 3.0, 0.0)
