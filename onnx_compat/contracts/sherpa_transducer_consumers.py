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
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np
import torch

from . import frontends
from .consumers import ConsumerMismatch, installed, program, run_child, run_program

_OFFLINE = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
folder, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OfflineRecognizer.from_transducer(
    encoder=f"{folder}/encoder.onnx", decoder=f"{folder}/decoder.onnx", joiner=f"{folder}/joiner.onnx",
    tokens=f"{folder}/tokens.txt", num_threads=1, feature_dim=int(dim), sample_rate=int(rate))
streams = []
for path in wavs:
    with wave.open(path) as f:
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768
    s = rec.create_stream()
    s.accept_waveform(int(rate), x)
    streams.append(s)
rec.decode_streams(streams)
print(json.dumps([list(s.result.tokens) for s in streams]))
"""

_ONLINE = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
folder, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OnlineRecognizer.from_transducer(
    tokens=f"{folder}/tokens.txt", encoder=f"{folder}/encoder.onnx", decoder=f"{folder}/decoder.onnx",
    joiner=f"{folder}/joiner.onnx", num_threads=1, feature_dim=int(dim), sample_rate=int(rate))
streams = []
for path in wavs:
    with wave.open(path) as f:
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768
    s = rec.create_stream()
    s.accept_waveform(int(rate), x)
    s.input_finished()
    streams.append(s)
while True:
    ready = [s for s in streams if rec.is_ready(s)]
    if not ready:
        break
    rec.decode_streams(ready)
print(json.dumps([list(rec.get_result_all(s).tokens) for s in streams]))
"""


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

    def reference(self, eager: Eager, vocabulary, bins: int, rate: int, online: bool):
        out, calls = [], []
        for samples in frontends.utterances(self.seconds, rate, seed=2):
            features = kaldi_features(samples, bins, rate)
            labels, n = online_labels(eager, features) if online else (offline_labels(eager, features), 1)
            out.append([vocabulary[k] for k in labels])
            calls.append(n)
        return out, calls

    def wavs(self, folder: str, rate: int) -> List[str]:
        paths = []
        for k, samples in enumerate(frontends.utterances(self.seconds, rate, seed=2)):
            paths.append(os.path.join(folder, f"utterance{k}.wav"))
            frontends.write_wav(paths[-1], samples, rate)
        return paths

    def check(self, name, expected, got, calls, t0) -> dict:
        if len(got) != len(expected):
            raise ConsumerMismatch(name, None, f"{len(expected)} results", f"{len(got)}")
        for k, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                raise ConsumerMismatch(name, k, want, have)
        return {"consumer": name, "ok": True, "utterances": len(expected), "tokens": [len(t) for t in expected],
                "calls": calls, "seconds": round(time.perf_counter() - t0, 3)}

    def run(self, folder, eager, vocabulary, bins, rate, online, command) -> dict:
        expected, calls = self.reference(eager, vocabulary, bins, rate, online)
        t0 = time.perf_counter()
        got = command(self.wavs(folder, rate))
        return self.check(self.name, expected, got, calls, t0)


def _fbank_missing() -> Optional[str]:
    return installed("kaldi_native_fbank")


@dataclass(frozen=True)
class OfflineTransducerPython(_Transducer):
    name: str = "sherpa-onnx Python OfflineRecognizer.from_transducer"

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx") or _fbank_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        return self.run(folder, eager, vocabulary, bins, rate, False, lambda wavs: json.loads(
            run_child(_OFFLINE, [folder, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class OfflineTransducerBinary(_Transducer):
    name: str = "sherpa-onnx-offline (native binary)"

    def available(self) -> Optional[str]:
        return (None if program("sherpa-onnx-offline") else "sherpa-onnx-offline is not installed "
                "(pip install sherpa-onnx-bin)") or _fbank_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        def command(wavs):
            text = run_program([program("sherpa-onnx-offline"), *_files(folder), "--num-threads=1",
                                f"--feat-dim={bins}", f"--sample-rate={rate}", *wavs], self.name)
            return [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]
        return self.run(folder, eager, vocabulary, bins, rate, False, command)


@dataclass(frozen=True)
class OnlineTransducerPython(_Transducer):
    name: str = "sherpa-onnx Python OnlineRecognizer.from_transducer"

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx") or _fbank_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        return self.run(folder, eager, vocabulary, bins, rate, True, lambda wavs: json.loads(
            run_child(_ONLINE, [folder, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class OnlineTransducerBinary(_Transducer):
    name: str = "sherpa-onnx (native streaming binary)"

    def available(self) -> Optional[str]:
        return (None if program("sherpa-onnx") else "sherpa-onnx is not installed (pip install sherpa-onnx-bin)") \
            or _fbank_missing()

    def verify(self, folder, eager, vocabulary, bins, rate=frontends.SAMPLE_RATE) -> dict:
        def command(wavs):
            text = run_program([program("sherpa-onnx"), *_files(folder), "--num-threads=1", f"--feat-dim={bins}",
                                f"--sample-rate={rate}", "--left-padding=0", "--right-padding=0", *wavs], self.name,
                               stderr=True)
            return [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]
        return self.run(folder, eager, vocabulary, bins, rate, True, command)


def _files(folder: str) -> List[str]:
    return [f"--{g}={os.path.join(folder, g + '.onnx')}" for g in ("encoder", "decoder", "joiner")] + \
        [f"--tokens={os.path.join(folder, 'tokens.txt')}"]
