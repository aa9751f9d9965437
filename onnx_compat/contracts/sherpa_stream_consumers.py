"""sherpa-onnx's streaming recognizers as the judge of a streaming export, against PyTorch's own streamed decode.

The utterances go in as WAV files; sherpa-onnx computes the features and cuts them into windows by its own rule
(a call when ``processed + window_size < frames``, ``processed += chunk_shift``); the reference computes the same
features (``frontends``), cuts them by the same rule, runs the unpatched eager step on each window with the states
carried from call to call, and decodes greedily over the whole stream. The Python binding decodes the utterances
as one batch (states stacked along the batch axis); the native binary gets the same files with no padding added.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from . import frontends
from .consumers import ConsumerMismatch, greedy_ctc, installed, program, run_child, run_program

_ONLINE = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
model, tokens, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OnlineRecognizer.from_nemo_ctc(tokens=tokens, model=model, num_threads=1, feature_dim=int(dim),
                                                 sample_rate=int(rate))
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


@dataclass(frozen=True)
class StreamJob:
    """What the reference needs of the export: the step as exported, its declarations and the initial states."""

    step: object          # streaming.step.StepModule
    inputs: list
    outputs: list
    initial: object       # batch -> flat initial states
    run: object           # streaming.probe.run_step: one eager call of the step (handed in: streaming imports us)


def streamed_log_probs(job: StreamJob, features: np.ndarray, window: int, shift: int) -> List[np.ndarray]:
    """PyTorch's stream over ``features`` ``[T, C]`` by sherpa-onnx's rule: output 0 of every call."""
    states, processed, out = job.initial(1), 0, []
    while processed + window < features.shape[0]:
        chunk = torch.from_numpy(features[processed:processed + window].T.copy())[None]
        got = job.run(job.step, [chunk, torch.tensor([window], dtype=torch.int64)], states, job.outputs, window)
        out.append(got.outputs[0][0].numpy())
        states, processed = got.states, processed + shift
    return out


@dataclass(frozen=True)
class _OnlineNemoCtc:
    seconds: tuple = (0.25, 1.3, 0.97, 2.1)  # the first is shorter than two chunks: one call at the bundled window

    def reference(self, job: StreamJob, applied, vocabulary, bins: int, rate: int):
        from .sherpa_streaming import blank_of
        window, shift = int(applied.metadata["window_size"]), int(applied.metadata["chunk_shift"])
        out, calls = [], []
        for samples in frontends.utterances(self.seconds, rate, seed=1):
            chunks = streamed_log_probs(job, frontends.nemo_ctc_features(samples, bins, "NA", rate), window, shift)
            log_probs = np.concatenate(chunks) if chunks else np.zeros((0, len(vocabulary)), np.float32)
            calls.append(len(chunks))
            out.append([vocabulary[k] for k in greedy_ctc(log_probs, log_probs.shape[0], blank_of(vocabulary))])
        return out, calls

    def check(self, name, expected, got, calls, t0) -> dict:
        if len(got) != len(expected):
            raise ConsumerMismatch(name, None, f"{len(expected)} results", f"{len(got)}")
        for k, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                raise ConsumerMismatch(name, k, want, have, f" ({calls[k]} calls of the streamed step)")
        return {"consumer": name, "ok": True, "utterances": len(expected), "calls": calls,
                "tokens": [len(t) for t in expected], "seconds": round(time.perf_counter() - t0, 3)}

    def _wavs(self, folder: str, rate: int) -> List[str]:
        paths = []
        for k, samples in enumerate(frontends.utterances(self.seconds, rate, seed=1)):
            paths.append(os.path.join(folder, f"stream{k}.wav"))
            frontends.write_wav(paths[-1], samples, rate)
        return paths


@dataclass(frozen=True)
class OnlineNemoCtcPython(_OnlineNemoCtc):
    name: str = "sherpa-onnx Python OnlineRecognizer.from_nemo_ctc"

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx") or installed("kaldi_native_fbank")

    def verify(self, folder, model_file, job, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        bins = applied.io["inputs"][0]["dims"][1]
        expected, calls = self.reference(job, applied, vocabulary, bins, rate)
        t0 = time.perf_counter()
        got = json.loads(run_child(_ONLINE, [model_file, os.path.join(folder, "tokens.txt"), str(bins), str(rate),
                                             *self._wavs(folder, rate)], self.name))
        return self.check(self.name, expected, got, calls, t0)


@dataclass(frozen=True)
class OnlineNemoCtcBinary(_OnlineNemoCtc):
    name: str = "sherpa-onnx (native streaming binary)"

    def available(self) -> Optional[str]:
        return (None if program("sherpa-onnx") else "sherpa-onnx is not installed (pip install sherpa-onnx-bin)") \
            or installed("kaldi_native_fbank")

    def verify(self, folder, model_file, job, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        bins = applied.io["inputs"][0]["dims"][1]
        expected, calls = self.reference(job, applied, vocabulary, bins, rate)
        t0 = time.perf_counter()
        text = run_program([program("sherpa-onnx"), f"--nemo-ctc-model={model_file}",
                            f"--tokens={os.path.join(folder, 'tokens.txt')}", "--num-threads=1",
                            f"--feat-dim={bins}", f"--sample-rate={rate}", "--left-padding=0", "--right-padding=0",
                            *self._wavs(folder, rate)], self.name, stderr=True)
        got = [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]
        return self.check(self.name, expected, got, calls, t0)
