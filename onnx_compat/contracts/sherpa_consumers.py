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
from typing import Optional

import numpy as np
import torch

from ..runtimes.compare import closeness
from . import frontends
from .consumers import ConsumerMismatch, eager, greedy_ctc, run_child
from .sherpa_runs import (SCRIPT_HEAD, binary_missing, binary_tokens, blank_id, judged, python_missing,
                          recognizer_script, write_wavs)


_RECOGNIZE = recognizer_script("""
model, tokens, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OfflineRecognizer.from_nemo_ctc(model=model, tokens=tokens, num_threads=1,
                                                  feature_dim=int(dim), sample_rate=int(rate))
""", online=False)

_EMBED = SCRIPT_HEAD + r"""
model, *wavs = sys.argv[1:]
ex = sherpa_onnx.SpeakerEmbeddingExtractor(sherpa_onnx.SpeakerEmbeddingExtractorConfig(model=model, num_threads=1))
out = []
for path in wavs:
    rate, x = samples(path)
    s = ex.create_stream()
    s.accept_waveform(rate, x)
    s.input_finished()
    out.append(list(map(float, ex.compute(s))))
print(json.dumps(out))
"""


@dataclass(frozen=True)
class _NemoCtc:
    """Shared by the Python binding and the native binary: the eager greedy decode of the same features."""

    seconds: tuple = (0.83, 1.37, 0.61, 1.02)  # unequal lengths in one batch; T from 61 to 137 frames

    def reference(self, model, inputs, applied, vocabulary, rate: int):
        meta = applied.metadata
        bins, blank = applied.io["inputs"][0]["dims"][1], blank_id(vocabulary)
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

    def run(self, folder, model, inputs, applied, vocabulary, rate: int, command) -> dict:
        """The eager reference, then ``command(bins, wavs)`` (the consumer's tokens of one padded batch), compared
        per utterance (``judged``: a mismatch is decoded again utterance by utterance)."""
        expected, frames = self.reference(model, inputs, applied, vocabulary, rate)
        bins, factor = applied.io["inputs"][0]["dims"][1], int(applied.metadata["subsampling_factor"])
        wavs = write_wavs(folder, self.seconds, rate)
        return judged(self.name, expected, lambda batch: command(bins, batch), wavs,
                      lambda k: f" (T={frames[k][0]}, sherpa-onnx decodes {frames[k][0] // factor} frames, the model "
                      f"has {frames[k][1]})", frames=[f[0] for f in frames])


@dataclass(frozen=True)
class NemoCtcPython(_NemoCtc):
    name: str = "sherpa-onnx Python OfflineRecognizer.from_nemo_ctc"

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, model_file, model, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        tokens = os.path.join(folder, "tokens.txt")
        return self.run(folder, model, inputs, applied, vocabulary, rate, lambda bins, wavs: json.loads(
            run_child(_RECOGNIZE, [model_file, tokens, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class NemoCtcBinary(_NemoCtc):
    name: str = "sherpa-onnx-offline (native binary)"

    def available(self) -> Optional[str]:
        return binary_missing("sherpa-onnx-offline")

    def verify(self, folder, model_file, model, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        flags = [f"--nemo-ctc-model={model_file}", f"--tokens={os.path.join(folder, 'tokens.txt')}"]
        return self.run(folder, model, inputs, applied, vocabulary, rate, lambda bins, wavs: binary_tokens(
            "sherpa-onnx-offline", flags, bins, rate, False, wavs, self.name))


@dataclass(frozen=True)
class SpeakerEmbeddingPython:
    name: str = "sherpa-onnx Python SpeakerEmbeddingExtractor"
    seconds: tuple = (0.9, 1.6, 0.7)
    atol: float = 1e-4
    rtol: float = 1e-3

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, model_file, model, inputs, applied, vocabulary=None) -> dict:
        meta = applied.metadata
        rate = int(meta["sample_rate"])
        expected = []
        for samples in frontends.utterances(self.seconds, rate):
            x = frontends.speaker_features(samples, meta["normalize_samples"] == "1",
                                           meta.get("feature_normalize_type", ""), rate)
            expected.append(eager(model, inputs, [torch.from_numpy(x)[None]])[0][0].numpy())
        wavs = write_wavs(folder, self.seconds, rate)
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
