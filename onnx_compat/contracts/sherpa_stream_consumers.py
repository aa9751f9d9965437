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
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from . import frontends
from .consumers import greedy_ctc, run_child
from .sherpa_runs import (binary_missing, binary_tokens, blank_id, judged, python_missing, recognizer_script,
                          write_wavs)

_ONLINE = recognizer_script("""
model, tokens, dim, rate, *wavs = sys.argv[1:]
rec = sherpa_onnx.OnlineRecognizer.from_nemo_ctc(tokens=tokens, model=model, num_threads=1, feature_dim=int(dim),
                                                 sample_rate=int(rate))
""", online=True)


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
        window, shift = int(applied.metadata["window_size"]), int(applied.metadata["chunk_shift"])
        out, calls = [], []
        for samples in frontends.utterances(self.seconds, rate, seed=1):
            chunks = streamed_log_probs(job, frontends.nemo_ctc_features(samples, bins, "NA", rate), window, shift)
            log_probs = np.concatenate(chunks) if chunks else np.zeros((0, len(vocabulary)), np.float32)
            calls.append(len(chunks))
            out.append([vocabulary[k] for k in greedy_ctc(log_probs, log_probs.shape[0], blank_id(vocabulary))])
        return out, calls

    def run(self, folder, job: StreamJob, applied, vocabulary, rate: int, command) -> dict:
        """The eager stream, then ``command(bins, wavs)`` (the consumer's tokens of one batch of streams), compared
        utterance by utterance (``judged``: a mismatch is decoded again utterance by utterance)."""
        bins = applied.io["inputs"][0]["dims"][1]
        expected, calls = self.reference(job, applied, vocabulary, bins, rate)
        wavs = write_wavs(folder, self.seconds, rate, seed=1, stem="stream")
        return judged(self.name, expected, lambda batch: command(bins, batch), wavs,
                      lambda k: f" ({calls[k]} calls of the streamed step)", batch="batch", calls=calls)


@dataclass(frozen=True)
class OnlineNemoCtcPython(_OnlineNemoCtc):
    name: str = "sherpa-onnx Python OnlineRecognizer.from_nemo_ctc"

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, model_file, job, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        tokens = os.path.join(folder, "tokens.txt")
        return self.run(folder, job, applied, vocabulary, rate, lambda bins, wavs: json.loads(
            run_child(_ONLINE, [model_file, tokens, str(bins), str(rate), *wavs], self.name)))


@dataclass(frozen=True)
class OnlineNemoCtcBinary(_OnlineNemoCtc):
    name: str = "sherpa-onnx (native streaming binary)"

    def available(self) -> Optional[str]:
        return binary_missing("sherpa-onnx")

    def verify(self, folder, model_file, job, inputs, applied, vocabulary, rate=frontends.SAMPLE_RATE) -> dict:
        flags = [f"--nemo-ctc-model={model_file}", f"--tokens={os.path.join(folder, 'tokens.txt')}"]
        return self.run(folder, job, applied, vocabulary, rate, lambda bins, wavs: binary_tokens(
            "sherpa-onnx", flags, bins, rate, True, wavs, self.name))
