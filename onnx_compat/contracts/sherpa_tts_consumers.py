"""sherpa-onnx's offline TTS as the judge of a VITS or Matcha export: the waveform it synthesizes from text against
PyTorch's synthesis of the same token ids.

Both sides see the same ids: sherpa-onnx's lexicon front end (``sherpa_tts.text_to_ids``, read from
``lexicon.cc``) turns each sentence into ids and synthesizes each sentence alone (``max_num_sentences`` 1), and the
audios are concatenated; ``silence_scale`` 1 (its default 0.2 shortens the pauses after synthesis) and noise scales
0, so the graph's random draws (``randn_like(...) * noise_scale``) are multiplied by 0 and vanish on both sides:
the comparison proves the deterministic path (text encoder, durations, alignment, flow or ODE, decoder), not the
noise's distribution. The Python binding returns float samples (compared with ``atol``); the native binary writes a
16-bit WAV file (``int16(sample * 32767)``, truncated), so its samples are compared within one 16-bit step more.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import wave
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from .consumers import ConsumerMismatch, installed, program, run_child, run_program

STEP16 = 1.0 / 32767  # one 16-bit step: the native binary writes int16(sample * 32767), truncated

_SCRIPT = r"""
import json, sys
import numpy as np
import sherpa_onnx
folder, kind, sid, *texts = sys.argv[1:]
if kind == "vits":
    model = sherpa_onnx.OfflineTtsModelConfig(vits=sherpa_onnx.OfflineTtsVitsModelConfig(
        model=f"{folder}/model.onnx", lexicon=f"{folder}/lexicon.txt", tokens=f"{folder}/tokens.txt",
        noise_scale=0.0, noise_scale_w=0.0, length_scale=1.0), num_threads=1)
else:
    model = sherpa_onnx.OfflineTtsModelConfig(matcha=sherpa_onnx.OfflineTtsMatchaModelConfig(
        acoustic_model=f"{folder}/acoustic_model.onnx", vocoder=f"{folder}/vocoder.onnx",
        lexicon=f"{folder}/lexicon.txt", tokens=f"{folder}/tokens.txt", noise_scale=0.0, length_scale=1.0),
        num_threads=1)
tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(model=model, max_num_sentences=1, silence_scale=1.0))
out = []
for text in texts:
    audio = tts.generate(text, sid=int(sid), speed=1.0)
    out.append({"rate": audio.sample_rate, "samples": np.asarray(audio.samples, dtype=np.float32).tolist()})
print(json.dumps(out))
"""


def _flags(kind: str, folder: str) -> List[str]:
    if kind == "vits":
        return [f"--vits-model={folder}/model.onnx", f"--vits-lexicon={folder}/lexicon.txt",
                f"--vits-tokens={folder}/tokens.txt", "--vits-noise-scale=0", "--vits-noise-scale-w=0",
                "--vits-length-scale=1"]
    return [f"--matcha-acoustic-model={folder}/acoustic_model.onnx", f"--matcha-vocoder={folder}/vocoder.onnx",
            f"--matcha-lexicon={folder}/lexicon.txt", f"--matcha-tokens={folder}/tokens.txt",
            "--matcha-noise-scale=0", "--matcha-length-scale=1"]


def read_wav(path: str):
    """``(rate, float32 samples)`` of the binary's WAV file (16-bit PCM, scaled back by 32767 as
    ``wave-writer.cc`` scaled it, or 32-bit float)."""
    with wave.open(path) as f:
        rate, width, data = f.getframerate(), f.getsampwidth(), f.readframes(f.getnframes())
    if width == 2:
        return rate, np.frombuffer(data, "<i2").astype(np.float32) / 32767
    return rate, np.frombuffer(data, "<f4").astype(np.float32)


def compare_audio(name: str, case: int, want: np.ndarray, got: np.ndarray, atol: float) -> dict:
    """One text's samples: the count exactly, then every sample within ``atol``; the worst sample reported."""
    if got.shape != want.shape:
        raise ConsumerMismatch(name, case, f"{want.size} samples", f"{got.size} samples")
    diff = np.abs(got.astype(np.float64) - want)
    worst = int(diff.argmax()) if diff.size else 0
    err = float(diff[worst]) if diff.size else 0.0
    if err > atol:
        raise ConsumerMismatch(name, case, f"every sample within {atol:g} of PyTorch's",
                               f"sample {worst}: {got[worst]:.6g} vs {want[worst]:.6g} (|diff| {err:.3g})")
    return {"samples": int(want.size), "max_abs_err": err, "worst_sample": worst,
            "peak": float(np.abs(want).max()) if want.size else 0.0}


@dataclass(frozen=True)
class TtsRun:
    """One proof: ``kind`` ("vits" or "matcha"), the texts, the speaker, PyTorch's audio of each text (float64),
    the sample rate the metadata says."""

    kind: str
    texts: Sequence[str]
    sid: int
    expected: Sequence[np.ndarray]
    sample_rate: int


def _judge(name: str, run: TtsRun, got: Sequence, atol: float, t0: float) -> dict:
    if len(got) != len(run.expected):
        raise ConsumerMismatch(name, None, f"{len(run.expected)} audios", f"{len(got)}")
    cases = []
    for k, ((rate, samples), want) in enumerate(zip(got, run.expected)):
        if rate != run.sample_rate:
            raise ConsumerMismatch(name, k, f"sample rate {run.sample_rate}", f"{rate}")
        cases.append(compare_audio(name, k, want, np.asarray(samples, np.float32), atol))
    worst = max(range(len(cases)), key=lambda k: cases[k]["max_abs_err"])
    return {"consumer": name, "ok": True, "texts": len(cases), "sid": run.sid, "atol": atol, "cases": cases,
            "max_abs_err": cases[worst]["max_abs_err"], "worst": {"text": worst, "sample": cases[worst]["worst_sample"]},
            "seconds": round(time.perf_counter() - t0, 3)}


@dataclass(frozen=True)
class TtsPython:
    """sherpa-onnx's Python binding, ``OfflineTts(...).generate(text, sid)``, in a child interpreter."""

    name: str = "sherpa-onnx Python OfflineTts"

    def available(self) -> Optional[str]:
        return installed("sherpa_onnx")

    def verify(self, folder: str, run: TtsRun, atol: float) -> dict:
        t0 = time.perf_counter()
        out = json.loads(run_child(_SCRIPT, [folder, run.kind, str(run.sid), *run.texts], self.name))
        return _judge(self.name, run, [(o["rate"], o["samples"]) for o in out], atol, t0)


@dataclass(frozen=True)
class TtsBinary:
    """sherpa-onnx's native ``sherpa-onnx-offline-tts``, one WAV file per text (16-bit: one step more of
    tolerance)."""

    name: str = "sherpa-onnx-offline-tts (native binary)"

    def available(self) -> Optional[str]:
        return None if program("sherpa-onnx-offline-tts") else \
            "sherpa-onnx-offline-tts is not installed (pip install sherpa-onnx-bin)"

    def verify(self, folder: str, run: TtsRun, atol: float) -> dict:
        t0 = time.perf_counter()
        got = []
        with tempfile.TemporaryDirectory(prefix="onnx_compat_tts_") as tmp:
            for k, text in enumerate(run.texts):
                wav = os.path.join(tmp, f"text{k}.wav")
                run_program([program("sherpa-onnx-offline-tts"), *_flags(run.kind, folder), "--num-threads=1",
                             f"--sid={run.sid}", "--tts-max-num-sentences=1", "--tts-silence-scale=1",
                             f"--output-filename={wav}", text], self.name)
                got.append(read_wav(wav))
        return _judge(self.name, run, got, atol + STEP16, t0)


CONSUMERS = (TtsPython(), TtsBinary())


def in_consumers(folder: str, run: TtsRun, atol: float, only: Optional[Callable[[str], bool]] = None) -> List[dict]:
    """Each installed consumer synthesizes ``run.texts`` from ``folder``; a missing one is listed with the reason."""
    checks = []
    for consumer in CONSUMERS:
        if only is not None and not only(consumer.name):
            continue
        missing = consumer.available()
        checks.append({"consumer": consumer.name, "ok": None, "skipped": missing} if missing
                      else consumer.verify(folder, run, atol))
    return checks
