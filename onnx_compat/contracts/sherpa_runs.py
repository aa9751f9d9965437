"""What every sherpa-onnx consumer run shares: whether it can run here, the WAV files it reads, the recognizer
scripts and binary command lines that decode them as one batch, and the token comparison against PyTorch.

One place, so the offline and online, CTC and transducer runners (``sherpa_consumers``,
``sherpa_stream_consumers``, ``sherpa_transducer_consumers``) feed sherpa-onnx and judge its answer the same way.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable, List, Optional, Sequence

from . import frontends
from .consumers import ConsumerMismatch, installed, program, run_program

BLANKS = ("<blk>", "<eps>", "<blank>")  # the order sherpa-onnx looks them up in


def blank_id(vocabulary: Sequence[str]) -> int:
    """The blank's index: the first of ``BLANKS`` in the vocabulary, as sherpa-onnx looks it up."""
    return list(vocabulary).index(next(b for b in BLANKS if b in vocabulary))

#: The child script's head: its imports and ``samples(path) -> (rate, float32 samples)`` of a 16-bit WAV file.
SCRIPT_HEAD = r"""
import json, sys, wave
import numpy as np
import sherpa_onnx
def samples(path):
    with wave.open(path) as f:
        return f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768
"""

_OFFLINE_DECODE = r"""
streams = []
for path in wavs:
    s = rec.create_stream()
    s.accept_waveform(int(rate), samples(path)[1])
    streams.append(s)
rec.decode_streams(streams)
print(json.dumps([list(s.result.tokens) for s in streams]))
"""

_ONLINE_DECODE = r"""
streams = []
for path in wavs:
    s = rec.create_stream()
    s.accept_waveform(int(rate), samples(path)[1])
    s.input_finished()
    streams.append(s)
while True:
    ready = [s for s in streams if rec.is_ready(s)]
    if not ready:
        break
    rec.decode_streams(ready)
print(json.dumps([list(rec.get_result_all(s).tokens) for s in streams]))
"""

#: The streaming binary pads nothing, so it sees the same frames as the Python binding and the reference.
_NO_PADDING = ("--left-padding=0", "--right-padding=0")


def recognizer_script(setup: str, online: bool) -> str:
    """A child script: ``setup`` reads ``sys.argv`` into ``rate`` and ``wavs`` and builds ``rec``; the script
    decodes all the files as one batch (online: fed until no stream is ready) and prints their tokens as JSON."""
    return SCRIPT_HEAD + setup.strip("\n") + "\n" + (_ONLINE_DECODE if online else _OFFLINE_DECODE).lstrip("\n")


def python_missing() -> Optional[str]:
    """Why the Python binding cannot run here (it, or the fbank the reference computes, is missing), or None."""
    return installed("sherpa_onnx") or installed("kaldi_native_fbank")


def binary_missing(name: str) -> Optional[str]:
    """Why the native binary ``name`` cannot run here (it, or the reference's fbank, is missing), or None."""
    return (None if program(name) else f"{name} is not installed (pip install sherpa-onnx-bin)") \
        or installed("kaldi_native_fbank")


def write_wavs(folder: str, seconds: Sequence[float], rate: int, seed: int = 0, stem: str = "utterance") -> List[str]:
    """The test utterances as 16-bit WAV files in ``folder`` (so both sides see the same samples); their paths."""
    paths = []
    for k, samples in enumerate(frontends.utterances(seconds, rate, seed=seed)):
        paths.append(os.path.join(folder, f"{stem}{k}.wav"))
        frontends.write_wav(paths[-1], samples, rate)
    return paths


def binary_tokens(name: str, model_flags: Sequence[str], bins: int, rate: int, online: bool, wavs: Sequence[str],
                  what: str) -> List[list]:
    """The tokens the native binary ``name`` decodes from ``wavs`` (one JSON line per file; the streaming one
    prints them on stderr)."""
    text = run_program([program(name), *model_flags, "--num-threads=1", f"--feat-dim={bins}", f"--sample-rate={rate}",
                        *(_NO_PADDING if online else ()), *wavs], what, stderr=online)
    return [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]


def compare_tokens(name: str, expected, got, t0: float, note=lambda k: "", **fields) -> dict:
    """The consumer's tokens against PyTorch's, utterance by utterance (``note(k)`` says what the mismatching
    one was); the report of a run that matched, with ``fields`` (its frames or calls)."""
    if len(got) != len(expected):
        raise ConsumerMismatch(name, None, f"{len(expected)} results", f"{len(got)}")
    for k, (want, have) in enumerate(zip(expected, got)):
        if want != have:
            raise ConsumerMismatch(name, k, want, have, note(k))
    return {"consumer": name, "ok": True, "utterances": len(expected), **fields,
            "tokens": [len(t) for t in expected], "seconds": round(time.perf_counter() - t0, 3)}


def judged(name: str, expected, command: Callable[[Sequence[str]], list], wavs: Sequence[str], note=lambda k: "",
           batch: str = "padding", **fields) -> dict:
    """``command(wavs)`` (the consumer's tokens of ``wavs`` decoded as one batch) against ``expected`` by
    ``compare_tokens``. A difference in a batch of several utterances is not the end of the story: the model may
    be right on each utterance and wrong only beside the others (an encoder that does not mask its padding), so
    each utterance is decoded again alone, and the mismatch says what that found (``ConsumerMismatch.cause`` is
    ``batch``, "padding" for a padded batch, when each alone matches PyTorch; ``alone`` holds their tokens)."""
    t0 = time.perf_counter()
    got = command(wavs)
    try:
        return compare_tokens(name, expected, got, t0, note, **fields)
    except ConsumerMismatch as mismatch:
        if mismatch.case is None or len(wavs) < 2:
            raise
        told = _decoded_alone(name, expected, command, wavs, mismatch, note, batch)
        if told is mismatch:
            raise
        raise told from mismatch


def _decoded_alone(name: str, expected, command, wavs, first: ConsumerMismatch, note, batch: str) -> ConsumerMismatch:
    """The mismatch ``first`` of a batch of ``len(wavs)``, told by each utterance decoded alone."""
    try:
        alone = [command([wav]) for wav in wavs]
    except ConsumerMismatch:
        return first  # the consumer fails on an utterance alone: the batch's mismatch is the first fact
    alone = [(tokens or [None])[0] for tokens in alone]
    size = f" in a batch of {len(wavs)}"
    differ = [k for k, (want, have) in enumerate(zip(expected, alone)) if want != have]
    if not differ:
        return ConsumerMismatch(name, first.case, first.expected, first.got, note(first.case) + size, cause=batch,
                                alone=alone)
    k = differ[0]
    return ConsumerMismatch(name, k, expected[k], alone[k], f"{note(k)} decoded alone (it differs alone too: not "
                            "the batch)", alone=alone)
