"""sherpa-onnx itself as the judge: its recognizer and extractor on audio, against eager PyTorch.

The audio goes in as WAV files (16-bit, so both sides see the same samples);
sherpa-onnx computes the features with its own front-end; the reference
computes the same features (``frontends.py``) and runs the unpatched eager
model on them, one utterance at a time. sherpa-onnx decodes the utterances
as one batch, so padding and per-item lengths are exercised too.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from ..runtimes.compare import closeness
from . import frontends
from .consumers import ConsumerMismatch, eager, greedy_ctc, installed, program, run_child, run_program


_RECOGNIZE = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
model, tokens, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OfflineRecognizer.from_nemo_ctc(model=model, tokens=tokens, num_threads=1,
                                                  feature_dim=int(dim), sample_rate=int(rate))
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

_EMBED = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
model, *wavs = sys.argv[1:]
ex = sherpa_onnx.SpeakerEmbeddingExtractor(sherpa_onnx.SpeakerEmbeddingExtractorConfig(model=model, num_threads=1))
out = []
for path in wavs:
    with wave.open(path) as f:
        rate = f.getframerate()
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768
    s = ex.create_stream()
    s.accept_waveform(rate, x)
    s.input_finished()
    out.append(list(map(float, ex.compute(s))))
print(json.dumps(out))
"""


def _wavs(folder: str, seconds, rate: int) -> List[str]:
    paths = []
    for k, samples in enumerate(frontends.utterances(seconds, rate)):
        paths.append(os.path.join(folder, f"utterance{k}.wav"))
        frontends.write_wav(paths[-1], samples, rate)
    return paths


@dataclass(frozen=True)
class _NemoCtc:
    """Shared by the Python binding and the native binary: the eager greedy decode of the same features."""

    seconds: tuple = (0.83, 1.37, 0.61, 1.02)  # unequal lengths in one batch; T from 61 to 137 frames

    def reference(self, model, inputs, applied, vocabulary, rate: int):
        meta = applied.metadata
        bins, blank = applied.io["inputs"][0]["dims"][1], vocabulary.index(
            next(b for b in ("<blk>", "<eps>", "<blank>") if b in vocabulary))
        out, frames = [], []
        for samples in frontends.utterances(self.seconds, rate):
            x = frontends.nemo_ctc_features(samples, bins, meta["normalize_type"], rate)
            lengths = torch.tensor([x.shape[0]], dtype=torch.int64)
            result = eager(model, inputs, [torch.from_numpy(x.T.copy())[None], lengths])
            log_probs = result[0][0].numpy()
            count = log_probs.shape[0]
            if len(result) > 1 and result[1].dim() == 1 and not result[1].dtype.is_floating_point:
                count = min(count, int(result[1][0]))
            frames.append((x.shape[0], count))
            out.append([vocabulary[k] for k in greedy_ctc(log_probs, count, blank)])
        return out, frames

    def compare(self, name: str, expected, got, frames, factor: int, seconds: float) -> dict:
        for k, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                raise ConsumerMismatch(name, k, want, have, f" (T={frames[k][0]}, sherpa-onnx decodes "
                                       f"{frames[k][0] // factor} frames, the model has {frames[k][1]})")
        if len(got) != len(expected):
            raise ConsumerMismatch(name, len(got), f"{len(expected)} results", f"{len(got)}")
        return {"consumer": name, "ok": True, "utterances": len(expected), "frames": [f[0] for f in frames],
                "tokens": [len(t) for t in expected], "seconds": round(seconds, 3)}


@dataclass(frozen=True)
class NemoCtcPython(_NemoCtc):
    name: str = "sherpa-onnx Python OfflineRecognizer.from_nemo_ctc"

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx") or installed("kaldi_native_fbank")

    def verify(self, folder, model_file, model, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        expected, frames = self.reference(model, inputs, applied, vocabulary, rate)
        wavs = _wavs(folder, self.seconds, rate)
        t0 = time.perf_counter()
        got = json.loads(run_child(_RECOGNIZE, [model_file, os.path.join(folder, "tokens.txt"),
                                                str(applied.io["inputs"][0]["dims"][1]), str(rate), *wavs], self.name))
        return self.compare(self.name, expected, got, frames, int(applied.metadata["subsampling_factor"]),
                            time.perf_counter() - t0)


@dataclass(frozen=True)
class NemoCtcBinary(_NemoCtc):
    name: str = "sherpa-onnx-offline (native binary)"

    def available(self) -> Optional[str]:
        return (None if program("sherpa-onnx-offline") else "sherpa-onnx-offline is not installed "
                "(pip install sherpa-onnx-bin)") or installed("kaldi_native_fbank")

    def verify(self, folder, model_file, model, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        expected, frames = self.reference(model, inputs, applied, vocabulary, rate)
        wavs = _wavs(folder, self.seconds, rate)
        t0 = time.perf_counter()
        text = run_program([program("sherpa-onnx-offline"), f"--nemo-ctc-model={model_file}",
                            f"--tokens={os.path.join(folder, 'tokens.txt')}", "--num-threads=1",
                            f"--feat-dim={applied.io['inputs'][0]['dims'][1]}", f"--sample-rate={rate}", *wavs], self.name)
        got = [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]
        return self.compare(self.name, expected, got, frames, int(applied.metadata["subsampling_factor"]),
                            time.perf_counter() - t0)


@dataclass(frozen=True)
class SpeakerEmbeddingPython:
    name: str = "sherpa-onnx Python SpeakerEmbeddingExtractor"
    seconds: tuple = (0.9, 1.6, 0.7)
    atol: float = 1e-4
    rtol: float = 1e-3

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx") or installed("kaldi_native_fbank")

    def verify(self, folder, model_file, model, inputs, applied, vocabulary=None) -> dict:
        meta = applied.metadata
        rate = int(meta["sample_rate"])
        expected = []
        for samples in frontends.utterances(self.seconds, rate):
            x = frontends.speaker_features(samples, meta["normalize_samples"] == "1",
                                           meta.get("feature_normalize_type", ""), rate)
            expected.append(eager(model, inputs, [torch.from_numpy(x)[None]])[0][0].numpy())
        wavs = _wavs(folder, self.seconds, rate)
        t0 = time.perf_counter()
        got = json.loads(run_child(_EMBED, [model_file, *wavs], self.name))
        worst = 0.0
        for k, (want, have) in enumerate(zip(expected, got)):
            have = np.asarray(have, np.float32)
            close = closeness(have, want, self.atol, self.rtol, relative_to="largest")
            err = close.max_abs_err
            if not close.ok:
                raise ConsumerMismatch(self.name, k, f"embedding {want[:4].round(5).tolist()}...",
                                       f"{have[:4].round(5).tolist()}... (shape {list(have.shape)}, max abs err {err:.3g})")
            worst = max(worst, err)
        return {"consumer": self.name, "ok": True, "utterances": len(expected), "max_abs_err": worst,
                "seconds": round(time.perf_counter() - t0, 3)}
