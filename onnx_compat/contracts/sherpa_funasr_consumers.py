"""sherpa-onnx's SenseVoice and Paraformer recognizers as the judges of an export, against PyTorch's decode.

The reference is sherpa-onnx's pipeline with the unpatched eager model: its features (``sherpa_funasr.features``:
kaldi-native-fbank with the options sherpa-onnx forces, LFR, the CMVN parsed from the metadata as written), the
model on one utterance at a time, and sherpa-onnx's decode rule -- SenseVoice: greedy CTC over ``T + 4`` frames
(blank ``blank_id``), the first four tokens dropped; Paraformer: the argmax of each output position up to the
first ``</s>``. sherpa-onnx decodes the WAV files as one padded batch (Python binding) and file by file in its
native binary, and says each token by its tokens.txt symbol (``sherpa_symbol``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from . import frontends
from .consumers import greedy_ctc, run_child
from .sherpa_funasr import FrontEnd, features, sherpa_symbol
from .sherpa_runs import binary_missing, binary_tokens, judged, python_missing, recognizer_script, write_wavs

SECONDS = (1.3, 0.9, 2.1, 1.6)  # unequal lengths in one batch: 22 to 35 LFR frames

_SENSE_VOICE = recognizer_script("""
model, tokens, language, use_itn, dim, *wavs = sys.argv[1:]
rate = 16000
rec = sherpa_onnx.OfflineRecognizer.from_sense_voice(model=model, tokens=tokens, num_threads=1, feature_dim=int(dim),
                                                     language=language, use_itn=bool(int(use_itn)))
""", online=False)

_PARAFORMER = recognizer_script("""
model, tokens, language, use_itn, dim, *wavs = sys.argv[1:]
rate = 16000
rec = sherpa_onnx.OfflineRecognizer.from_paraformer(paraformer=model, tokens=tokens, num_threads=1,
                                                    feature_dim=int(dim))
""", online=False)


@dataclass(frozen=True)
class FunAsrRun:
    """What a run needs besides the files: ``ids(features)`` the reference's token ids of one utterance (the
    family's decode rule over the eager model), the front end, the symbols of tokens.txt, and the options the
    recognizer is built with (SenseVoice's language and ITN)."""

    family: str  # "sense-voice" or "paraformer"
    ids: Callable[[np.ndarray], List[int]]
    front: FrontEnd
    vocabulary: Sequence[str]
    language: str = ""
    use_itn: bool = False

    def reference(self, seconds: Sequence[float] = SECONDS) -> List[List[int]]:
        return [self.ids(features(s, self.front, self.front.upscale)) for s in frontends.utterances(seconds)]


def sense_voice_ids(model, language_id: int, textnorm_id: int, blank_id: int) -> Callable[[np.ndarray], List[int]]:
    """SenseVoice's reference decode of one utterance: the model's logits, greedy CTC over ``T + 4`` frames, the
    first four tokens dropped (sherpa-onnx reports them as language, emotion and event)."""
    def ids(x: np.ndarray) -> List[int]:
        t = x.shape[0]
        with torch.no_grad():
            logits = model(torch.from_numpy(x)[None], torch.tensor([t], dtype=torch.int32),
                           torch.tensor([language_id], dtype=torch.int32),
                           torch.tensor([textnorm_id], dtype=torch.int32))
        logits = logits[0] if isinstance(logits, (tuple, list)) else logits
        return greedy_ctc(logits[0].numpy(), t + 4, blank_id)[4:]
    return ids


def paraformer_ids(model, eos_id: int) -> Callable[[np.ndarray], List[int]]:
    """Paraformer's reference decode of one utterance: the argmax of each output position until ``</s>``."""
    def ids(x: np.ndarray) -> List[int]:
        out = []
        for k in model_logits(model, x).argmax(-1).tolist():
            if k == eos_id:
                break
            out.append(k)
        return out
    return ids


def model_logits(model, x: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.from_numpy(x)[None], torch.tensor([x.shape[0]], dtype=torch.int32))
    return (out[0] if isinstance(out, (tuple, list)) else out)[0]


@dataclass(frozen=True)
class _FunAsr:
    seconds: tuple = SECONDS

    def run(self, folder: str, run: FunAsrRun, command, ids=None) -> dict:
        ids = ids or run.reference(self.seconds)
        expected = [[sherpa_symbol(run.vocabulary[i]) for i in decoded] for decoded in ids]
        report = judged(self.name, expected, command, write_wavs(folder, self.seconds, frontends.SAMPLE_RATE),
                        lambda k: f" (ids {ids[k]})")
        return {**report, "ids": ids, "distinct": [len(set(i)) for i in ids], "language": run.language}


@dataclass(frozen=True)
class FunAsrPython(_FunAsr):
    """sherpa-onnx's Python binding (``from_sense_voice`` / ``from_paraformer``), every file in one batch."""

    name: str = "sherpa-onnx Python OfflineRecognizer (FunASR)"

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder: str, run: FunAsrRun, ids=None) -> dict:
        script = _SENSE_VOICE if run.family == "sense-voice" else _PARAFORMER
        model, tokens = os.path.join(folder, "model.onnx"), os.path.join(folder, "tokens.txt")
        name = f"sherpa-onnx Python OfflineRecognizer.from_{run.family.replace('-', '_')}"
        return {**self.run(folder, run, lambda wavs: json.loads(run_child(
            script, [model, tokens, run.language, str(int(run.use_itn)), str(run.front.n_mels), *wavs], name)), ids),
            "consumer": name}


@dataclass(frozen=True)
class FunAsrBinary(_FunAsr):
    """sherpa-onnx's native ``sherpa-onnx-offline --sense-voice-model`` / ``--paraformer``, the same files."""

    name: str = "sherpa-onnx-offline (native binary, FunASR)"

    def available(self) -> Optional[str]:
        return binary_missing("sherpa-onnx-offline")

    def verify(self, folder: str, run: FunAsrRun, ids=None) -> dict:
        model, tokens = os.path.join(folder, "model.onnx"), os.path.join(folder, "tokens.txt")
        if run.family == "sense-voice":
            flags = [f"--sense-voice-model={model}", f"--sense-voice-language={run.language}",
                     f"--sense-voice-use-itn={int(run.use_itn)}"]
        else:
            flags = [f"--paraformer={model}"]
        name = f"sherpa-onnx-offline --{'sense-voice-model' if run.family == 'sense-voice' else 'paraformer'} " \
               "(native binary)"
        return {**self.run(folder, run, lambda wavs: binary_tokens(
            "sherpa-onnx-offline", flags + [f"--tokens={tokens}"], run.front.n_mels, frontends.SAMPLE_RATE, False,
            wavs, name), ids), "consumer": name}


def in_consumers(folder: str, run: FunAsrRun) -> List[dict]:
    """Each installed consumer on the files in ``folder`` (one PyTorch decode for both); one not installed is
    listed with the reason."""
    out, ids = [], None
    for consumer in (FunAsrPython(), FunAsrBinary()):
        missing = consumer.available()
        if missing:
            out.append({"consumer": consumer.name, "ok": None, "skipped": missing})
            continue
        ids = ids or run.reference(consumer.seconds)
        out.append(consumer.verify(folder, run, ids))
    return out
