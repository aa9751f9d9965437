"""Test audio, and sherpa-onnx's feature front-ends as kaldi-native-fbank computes them.

Verification inside sherpa-onnx compares its decode of audio with PyTorch's
decode of the *same features*; sherpa-onnx computes them with its bundled
kaldi-native-fbank, so the reference computes them with the pip package and
the options sherpa-onnx sets (read from its C++ sources, v2.0.x):

- offline NeMo CTC (``offline-recognizer-ctc-impl.h``, ``offline-stream.cc``):
  25 ms / 10 ms frames, no dither, ``snip_edges`` off, Hann window, no DC
  removal, pre-emphasis 0.97 (kaldi-native-fbank's default: the offline stream
  does not pass it on), ``is_librosa`` mel banks from 0 Hz to Nyquist, log
  power; samples in [-1, 1]; then NeMo's ``per_feature`` normalization when
  the metadata asks for it (mean and population variance per bin over the
  utterance, ``(x - mean) / (sqrt(var) + 1e-5)``).
- speaker embeddings, wespeaker/3d-speaker (``speaker-embedding-extractor-
  general-impl.h``, ``features.cc``): Kaldi defaults (Povey window, DC
  removal, pre-emphasis 0.97, mel banks 20 Hz .. Nyquist - 400 Hz), 80 bins;
  samples times 32768 unless ``normalize_samples`` is 1; ``global-mean``
  subtracts the mean per bin.
"""
from __future__ import annotations

import wave
from typing import List, Sequence

import numpy as np

SAMPLE_RATE = 16000


def utterances(seconds: Sequence[float] = (0.83, 1.37, 0.61), rate: int = SAMPLE_RATE, seed: int = 0) -> List[np.ndarray]:
    """Deterministic speech-like test signals (gliding harmonics, an envelope, a little noise), float32 in [-1, 1],
    already on the 16-bit grid so a WAV file holds exactly these samples."""
    rng = np.random.default_rng(seed)
    out = []
    for length in seconds:
        t = np.arange(int(length * rate)) / rate
        pitch = 110 + 90 * rng.random() + 40 * np.sin(2 * np.pi * (0.5 + rng.random()) * t)
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        voice = sum(np.sin(k * phase) / k for k in range(1, 8))
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * (2 + 3 * rng.random()) * t) ** 2
        x = 0.25 * voice * envelope + 0.02 * rng.standard_normal(t.size)
        out.append((np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32))
    return out


def write_wav(path: str, samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.round(samples * 32768).astype("<i2").tobytes())


def _fbank(samples: np.ndarray, options) -> np.ndarray:
    import kaldi_native_fbank as knf
    bank = knf.OnlineFbank(options)
    bank.accept_waveform(options.frame_opts.samp_freq, samples.tolist())
    bank.input_finished()
    return np.stack([np.asarray(bank.get_frame(i)) for i in range(bank.num_frames_ready)]).astype(np.float32)


def nemo_ctc_features(samples: np.ndarray, bins: int, normalize_type: str, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[T, bins]`` as sherpa-onnx's offline NeMo CTC recognizer computes them."""
    import kaldi_native_fbank as knf
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = rate
    o.frame_opts.dither = 0
    o.frame_opts.snip_edges = False
    o.frame_opts.remove_dc_offset = False
    o.frame_opts.window_type = "hann"
    o.mel_opts.num_bins = bins
    o.mel_opts.low_freq = 0
    o.mel_opts.high_freq = 0
    o.mel_opts.is_librosa = True
    x = _fbank(samples, o)
    if normalize_type == "per_feature":
        mean = x.mean(0)
        var = np.maximum((x * x).mean(0) - mean * mean, 0)
        x = (x - mean) / (np.sqrt(var) + 1e-5)
    return x.astype(np.float32)


def speaker_features(samples: np.ndarray, normalize_samples: bool, normalize_type: str = "",
                     rate: int = SAMPLE_RATE) -> np.ndarray:
    """``[T, 80]`` as sherpa-onnx's wespeaker/3d-speaker embedding extractor computes them."""
    import kaldi_native_fbank as knf
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = rate
    o.frame_opts.dither = 0
    o.frame_opts.snip_edges = False
    o.mel_opts.num_bins = 80
    o.mel_opts.low_freq = 20
    o.mel_opts.high_freq = -400
    x = _fbank(samples if normalize_samples else samples * 32768, o)
    if normalize_type == "global-mean":
        x = x - x.mean(0)
    return x.astype(np.float32)
