"""sherpa-onnx's NeMo transducer recognizer as the judge of an export, against PyTorch's greedy decode.

The reference runs the three eager callables by sherpa-onnx's greedy rules (``offline-transducer-greedy-search-
nemo-decoder.cc``): the decoder first fed the blank with zero states; RNN-T at most 10 tokens per frame; TDT one
joiner call per step, the skip the duration argmax's index, at most 5 tokens per frame, a blank with skip 0
advancing one frame. Both decode sherpa-onnx's features for this loader (``offline-recognizer-transducer-nemo-
impl.h`` PostInit): kaldi-native-fbank with the Povey window and the mel banks' upper edge at Nyquist - 400 Hz
(the Hann / 8000 Hz lines are commented out there), low edge 0, librosa mel banks, no DC removal, pre-emphasis
0.97, then ``per_feature`` normalisation. That is not NeMo's own front end (Hann window, upper edge Nyquist, frames
centred by ``torch.stft``): ``frontend_difference`` measures the two on the same audio.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from . import frontends
from .consumers import run_child
from .sherpa_runs import binary_missing, binary_tokens, judged, python_missing, recognizer_script, write_wavs

MAX_SYMBOLS = 10  # RNN-T tokens per frame
MAX_TDT_TOKENS = 5  # TDT tokens per frame

_SETUP = """
folder, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OfflineRecognizer.from_transducer(
    encoder=f"{folder}/encoder.onnx", decoder=f"{folder}/decoder.onnx", joiner=f"{folder}/joiner.onnx",
    tokens=f"{folder}/tokens.txt", num_threads=1, feature_dim=int(dim), sample_rate=int(rate),
    model_type="nemo_transducer")
"""
_SCRIPT = recognizer_script(_SETUP, online=False)


def features(samples: np.ndarray, bins: int, normalize_type: str, rate: int = frontends.SAMPLE_RATE) -> np.ndarray:
    """``[T, bins]`` as sherpa-onnx's NeMo transducer recognizer computes them."""
    import kaldi_native_fbank as knf
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = rate
    o.frame_opts.dither = 0
    o.frame_opts.snip_edges = False
    o.frame_opts.remove_dc_offset = False
    o.mel_opts.num_bins = bins
    o.mel_opts.low_freq = 0
    o.mel_opts.high_freq = -400
    o.mel_opts.is_librosa = True
    x = frontends._fbank(samples, o)
    if normalize_type == "per_feature":
        mean = x.mean(0)
        var = np.maximum((x * x).mean(0) - mean * mean, 0)
        x = (x - mean) / (np.sqrt(var) + 1e-5)
    return x.astype(np.float32)


@dataclass(frozen=True)
class NemoEager:
    """The eager encoder ``(audio_signal [1, C, T], length) -> ([1, D, T'], lengths)``, decoder ``(targets,
    target_length, h, c) -> (g [1, H, 1], _, h, c)``, joiner ``([1, D, 1], [1, H, 1]) -> logits``; the vocabulary
    without the blank (the blank is its size), the prediction LSTM's shape, the durations (empty: RNN-T)."""

    encoder: Callable
    decoder: Callable
    joiner: Callable
    vocab_size: int
    layers: int
    hidden: int
    durations: Sequence[int] = ()
    normalize_type: str = "per_feature"


def _step(eager: NemoEager, token: int, h, c):
    g, _, h, c = eager.decoder(torch.tensor([[token]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32), h, c)
    return g, h, c


def _start(eager: NemoEager):
    zeros = torch.zeros(eager.layers, 1, eager.hidden)
    return _step(eager, eager.vocab_size, zeros, zeros.clone())


def rnnt_greedy(eager: NemoEager, frames: torch.Tensor) -> List[int]:
    """sherpa-onnx's RNN-T greedy over ``frames`` ``[T', D]``: up to 10 tokens per frame, blank = vocab_size."""
    blank, tokens = eager.vocab_size, []
    g, h, c = _start(eager)
    for t in range(frames.shape[0]):
        for _ in range(MAX_SYMBOLS):
            logits = eager.joiner(frames[t].reshape(1, -1, 1), g).reshape(-1)
            y = int(logits[:blank + 1].argmax())
            if y == blank:
                break
            tokens.append(y)
            g, h, c = _step(eager, y, h, c)
    return tokens


def tdt_greedy(eager: NemoEager, frames: torch.Tensor) -> List[int]:
    """sherpa-onnx's TDT greedy: one joiner call per step, skip = the duration argmax's index."""
    blank, tokens, t, per_frame = eager.vocab_size, [], 0, 0
    g, h, c = _start(eager)
    while t < frames.shape[0]:
        logits = eager.joiner(frames[t].reshape(1, -1, 1), g).reshape(-1)
        y = int(logits[:blank + 1].argmax())
        skip = int(logits[blank + 1:blank + 1 + len(eager.durations)].argmax())
        if y != blank:
            tokens.append(y)
            g, h, c = _step(eager, y, h, c)
            per_frame += 1
        if skip > 0:
            per_frame = 0
        if per_frame >= MAX_TDT_TOKENS or (y == blank and skip == 0):
            per_frame, skip = 0, 1
        t += skip
    return tokens


def decode(eager: NemoEager, feats: np.ndarray) -> List[int]:
    """PyTorch's tokens for one utterance's ``[T, C]`` features."""
    with torch.no_grad():
        out, lengths = eager.encoder(torch.from_numpy(feats.T.copy())[None], torch.tensor([feats.shape[0]]))
        frames = out[0, :, :int(lengths[0])].T
        return (tdt_greedy if eager.durations else rnnt_greedy)(eager, frames)


def shown(symbol: str) -> str:
    """A token as sherpa-onnx returns it: SentencePiece's word mark ``▁`` rendered as a space."""
    return symbol.replace("\u2581", " ")


@dataclass(frozen=True)
class _Nemo:
    seconds: tuple = (1.27, 0.83, 1.9, 0.61)  # unequal lengths in one padded batch

    def reference(self, eager: NemoEager, vocabulary, bins: int, rate: int):
        return [[shown(vocabulary[k]) for k in decode(eager, features(s, bins, eager.normalize_type, rate))]
                for s in frontends.utterances(self.seconds, rate, seed=4)]

    def run(self, folder, eager, vocabulary, bins, rate, command) -> dict:
        expected = self.reference(eager, vocabulary, bins, rate)
        wavs = write_wavs(folder, self.seconds, rate, seed=4)
        return judged(self.name, expected, command, wavs, batch="padding")


@dataclass(frozen=True)
class NemoTransducerPython(_Nemo):
    """sherpa-onnx's Python binding with ``model_type="nemo_transducer"``, all the files in one batch."""

    name: str = "sherpa-onnx Python OfflineRecognizer.from_transducer(model_type='nemo_transducer')"

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        return self.run(folder, eager, vocabulary, bins, rate, lambda wavs: json.loads(
            run_child(_SCRIPT, [folder, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class NemoTransducerBinary(_Nemo):
    """``sherpa-onnx-offline`` without ``--model-type``: routed by the encoder's ``model_type`` metadata."""

    name: str = "sherpa-onnx-offline (native binary)"

    def available(self) -> Optional[str]:
        return binary_missing("sherpa-onnx-offline")

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        flags = [f"--{g}={os.path.join(folder, g + '.onnx')}" for g in ("encoder", "decoder", "joiner")] + \
            [f"--tokens={os.path.join(folder, 'tokens.txt')}"]
        return self.run(folder, eager, vocabulary, bins, rate, lambda wavs: binary_tokens(
            "sherpa-onnx-offline", flags, bins, rate, False, wavs, self.name))


CONSUMERS = (NemoTransducerPython(), NemoTransducerBinary())


def frontend_difference(preprocessor: Callable, eager: NemoEager, bins: int, seconds: Sequence[float] = (1.27, 1.9),
                        rate: int = frontends.SAMPLE_RATE) -> dict:
    """sherpa-onnx's features for this loader against the model's own front end (``preprocessor(signal [1, S],
    length [1]) -> ([1, C, T], lengths)``, NeMo's ``AudioToMelSpectrogramPreprocessor``) on the same audio: the
    frame counts, the largest and mean absolute difference of the normalised features over the frames both have,
    and how many utterances PyTorch decodes to other tokens from NeMo's features."""
    frames, worst, mean, differ = [], 0.0, [], 0
    for samples in frontends.utterances(seconds, rate, seed=4):
        ours = features(samples, bins, eager.normalize_type, rate)
        with torch.no_grad():
            nemo, length = preprocessor(torch.from_numpy(samples)[None], torch.tensor([samples.size]))
        nemo = nemo[0, :, :int(length[0])].T.numpy()
        frames.append([ours.shape[0], nemo.shape[0]])
        n = min(ours.shape[0], nemo.shape[0])
        gap = np.abs(ours[:n] - nemo[:n])
        worst, mean = max(worst, float(gap.max())), mean + [float(gap.mean())]
        differ += decode(eager, ours) != decode(eager, np.ascontiguousarray(nemo))
    return {"frames (sherpa-onnx, NeMo)": frames, "max_abs": round(worst, 3), "mean_abs": round(float(np.mean(mean)), 3),
            "utterances decoded differently from NeMo's features": differ, "utterances": len(seconds)}
