"""sherpa-onnx's transducer recognizers as the judge of a three-graph export, against PyTorch's greedy decode.

The reference decodes through the eager callables of the three parts by sherpa-onnx's greedy rule (one joiner
call per frame, at most one label per frame, blank 0, the context starting at ``[-1, ..., -1, 0]``), on the same
features (Kaldi's fbank with sherpa-onnx's options) -- offline one utterance at a time (sherpa-onnx decodes them
as one padded batch), online cut into calls by sherpa-onnx's rule with the encoder's states and the decoder's
context carried from call to call. The utterances go to sherpa-onnx as WAV files, all in one batch.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np
import torch

from . import frontends
from .consumers import run_child
from .sherpa_runs import binary_missing, binary_tokens, judged, python_missing, recognizer_script, write_wavs

_SETUP = """
folder, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.{kind}Recognizer.from_transducer(
    encoder=f"{{folder}}/encoder.onnx", decoder=f"{{folder}}/decoder.onnx", joiner=f"{{folder}}/joiner.onnx",
    tokens=f"{{folder}}/tokens.txt", num_threads=1, feature_dim=int(dim), sample_rate=int(rate))
"""
_OFFLINE = recognizer_script(_SETUP.format(kind="Offline"), online=False)
_ONLINE = recognizer_script(_SETUP.format(kind="Online"), online=True)


def kaldi_features(samples: np.ndarray, bins: int, rate: int = frontends.SAMPLE_RATE) -> np.ndarray:
    """``[T, bins]`` as sherpa-onnx's transducer recognizers compute them (Kaldi defaults, 20 Hz .. Nyquist - 400)."""
    import kaldi_native_fbank as knf
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = rate
    o.frame_opts.dither = 0
    o.frame_opts.snip_edges = False
    o.mel_opts.num_bins = bins
    o.mel_opts.low_freq = 20
    o.mel_opts.high_freq = -400
    return frontends._fbank(samples, o)


@dataclass(frozen=True)
class Eager:
    """The three eager callables (sherpa-onnx's layout) and, online, the initial states, ``T`` and the shift."""

    encoder: Callable
    decoder: Callable
    joiner: Callable
    context: int
    initial: Optional[Callable] = None  # () -> the carried states at batch 1
    frames: int = 0
    shift: int = 0
    processed: bool = False  # the encoder also takes the feature frames fed before the call (int64 [N])


def greedy(encoder_out: torch.Tensor, eager: Eager, context: List[int]):
    """sherpa-onnx's greedy rule in PyTorch over ``encoder_out`` ``[T', J]``; returns (labels, context)."""
    labels = []
    with torch.no_grad():
        decoded = eager.decoder(torch.tensor([context], dtype=torch.int64))
        for t in range(encoder_out.shape[0]):
            best = int(eager.joiner(encoder_out[t:t + 1], decoded).argmax(-1)[0])
            if best != 0:
                labels.append(best)
                context = context[1:] + [best]
                decoded = eager.decoder(torch.tensor([context], dtype=torch.int64))
    return labels, context


def offline_labels(eager: Eager, features: np.ndarray) -> List[int]:
    with torch.no_grad():
        out, lengths = eager.encoder(torch.from_numpy(features)[None], torch.tensor([features.shape[0]]))
    return greedy(out[0, :int(lengths[0])], eager, [-1] * (eager.context - 1) + [0])[0]


def online_labels(eager: Eager, features: np.ndarray):
    """The stream cut as sherpa-onnx cuts it; returns (labels, calls)."""
    states, context, labels, processed, calls = eager.initial(), [-1] * (eager.context - 1) + [0], [], 0, 0
    while processed + eager.frames < features.shape[0]:
        chunk = torch.from_numpy(features[processed:processed + eager.frames].copy())[None]
        count = [torch.tensor([processed], dtype=torch.int64)] if eager.processed else []
        with torch.no_grad():
            out, *states = eager.encoder(chunk, *states, *count)
        new, context = greedy(out[0], eager, context)
        labels += new
        processed, calls = processed + eager.shift, calls + 1
    return labels, calls


@dataclass(frozen=True)
class _Transducer:
    seconds: tuple = (0.31, 1.27, 0.83, 1.9)  # unequal lengths in one batch; online, the first is two calls
    online: bool = False

    def reference(self, eager: Eager, vocabulary, bins: int, rate: int, online: bool):
        out, calls = [], []
        for samples in frontends.utterances(self.seconds, rate, seed=2):
            features = kaldi_features(samples, bins, rate)
            labels, n = online_labels(eager, features) if online else (offline_labels(eager, features), 1)
            out.append([vocabulary[k] for k in labels])
            calls.append(n)
        return out, calls

    def run(self, folder, eager, vocabulary, bins, rate, command) -> dict:
        """PyTorch's labels, then ``command(wavs)`` (the consumer's, all in one batch: padded offline, stacked
        streams online), compared utterance by utterance (``judged``: a mismatch is decoded again alone)."""
        expected, calls = self.reference(eager, vocabulary, bins, rate, self.online)
        wavs = write_wavs(folder, self.seconds, rate, seed=2)
        return judged(self.name, expected, command, wavs, batch="batch" if self.online else "padding", calls=calls)


@dataclass(frozen=True)
class _TransducerPython(_Transducer):
    """sherpa-onnx's Python binding, all the files in one batch."""

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        script = _ONLINE if self.online else _OFFLINE
        return self.run(folder, eager, vocabulary, bins, rate, lambda wavs: json.loads(
            run_child(script, [folder, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class _TransducerBinary(_Transducer):
    """sherpa-onnx's native binary (``program``), the same files."""

    program: str = ""

    def available(self) -> Optional[str]:
        return binary_missing(self.program)

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        return self.run(folder, eager, vocabulary, bins, rate, lambda wavs: binary_tokens(
            self.program, _files(folder), bins, rate, self.online, wavs, self.name))


@dataclass(frozen=True)
class OfflineTransducerPython(_TransducerPython):
    name: str = "sherpa-onnx Python OfflineRecognizer.from_transducer"


@dataclass(frozen=True)
class OfflineTransducerBinary(_TransducerBinary):
    name: str = "sherpa-onnx-offline (native binary)"
    program: str = "sherpa-onnx-offline"


@dataclass(frozen=True)
class OnlineTransducerPython(_TransducerPython):
    name: str = "sherpa-onnx Python OnlineRecognizer.from_transducer"
    online: bool = True


@dataclass(frozen=True)
class OnlineTransducerBinary(_TransducerBinary):
    name: str = "sherpa-onnx (native streaming binary)"
    program: str = "sherpa-onnx"
    online: bool = True


def _files(folder: str) -> List[str]:
    return [f"--{g}={os.path.join(folder, g + '.onnx')}" for g in ("encoder", "decoder", "joiner")] + \
        [f"--tokens={os.path.join(folder, 'tokens.txt')}"]
