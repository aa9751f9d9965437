"""sherpa-onnx's Whisper recognizer as the judge of an encoder/decoder export, against PyTorch's greedy decode.

The reference is sherpa-onnx's pipeline in PyTorch (k2-fsa/sherpa-onnx 634265c9): kaldi-native-fbank's
``OnlineWhisperFbank`` (``n_mels`` bins, samples in [-1, 1]); at most 2950 frames kept; ``log10(max(x, 1e-10))``,
clamped to its maximum - 8 and ``(x + 4) / 4`` over the real frames only (``NormalizeWhisperFeatures``); then
``tail_paddings`` (1000) frames of zeros, ``T`` capped at 3000 (``offline-recognizer-whisper-impl.h``); the
encoder once; the initial tokens ``sot_sequence`` with the language put in (multilingual) and
``<|notimestamps|>`` appended; greedy argmax on the raw logits -- no token suppression, no temperature fallback,
unlike ``generate()`` -- until ``<|endoftext|>``, at most ``int(frames / 100 * 6)`` tokens (and
``n_text_ctx / 2``), stopping when the position reaches ``n_text_ctx - 1``
(``offline-whisper-greedy-search-decoder.cc``). The logits come from the checkpoint's own transformers decoder
(the whole prefix every step, no cache) on the encoder's output, so the exported cache path is judged against an
independent computation. sherpa-onnx prints the tokens.txt symbols of the ids it decoded, skipping ids the file
lacks: the reference says the same symbols (as each consumer prints them), and counts what it skipped.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from . import frontends
from .consumers import ConsumerMismatch, run_child
from .sherpa_runs import SCRIPT_HEAD, binary_missing, compare_tokens, python_missing
from .consumers import program, run_program

MAX_FRAMES = 3000
TAIL_PADDINGS = 1000

_SETUP = """
folder, language, *wavs = sys.argv[1:]
rec = sherpa_onnx.OfflineRecognizer.from_whisper(
    encoder=f"{folder}/encoder.onnx", decoder=f"{folder}/decoder.onnx", tokens=f"{folder}/tokens.txt",
    language=language, task="transcribe", num_threads=1)
streams = []
for path in wavs:
    s = rec.create_stream()
    s.accept_waveform(*samples(path))
    streams.append(s)
rec.decode_streams(streams)
def tokens(s):
    try:
        return list(s.result.tokens)
    except UnicodeDecodeError:  # a piece that is not complete UTF-8 alone
        return {"text": s.result.text}
print(json.dumps([tokens(s) for s in streams]))
"""
_SCRIPT = SCRIPT_HEAD + _SETUP


def whisper_features(samples: np.ndarray, n_mels: int, tail: int = TAIL_PADDINGS):
    """``(mel [1, n_mels, T], real frames)`` as sherpa-onnx's Whisper recognizer feeds its encoder."""
    import kaldi_native_fbank as knf
    options = knf.WhisperFeatureOptions()
    options.dim = n_mels
    bank = knf.OnlineWhisperFbank(options)
    bank.accept_waveform(frontends.SAMPLE_RATE, samples.tolist())
    bank.input_finished()
    x = np.stack([np.asarray(bank.get_frame(i)) for i in range(bank.num_frames_ready)]).astype(np.float32)
    x = x[:MAX_FRAMES - 50]
    x = np.log10(np.maximum(x, np.float32(1e-10)))
    x = (np.maximum(x, x.max() - np.float32(8)) + np.float32(4)) / np.float32(4)
    frames = x.shape[0]
    mel = np.zeros((min(frames + tail, MAX_FRAMES), n_mels), np.float32)
    mel[:frames] = x
    return torch.from_numpy(mel.T.copy())[None], frames


@dataclass(frozen=True)
class WhisperEager:
    """The checkpoint as the reference runs it: ``hidden(mel)`` the encoder's output, ``logits(tokens, hidden)``
    the last position's logits of the whole prefix; the decode's token ids and limits from the metadata."""

    hidden: Callable
    logits: Callable
    initial: Sequence[int]  # sot_sequence with the language, then <|notimestamps|>
    eot: int
    n_text_ctx: int


def greedy_ids(eager: WhisperEager, mel: torch.Tensor, frames: int) -> List[int]:
    """sherpa-onnx's greedy loop (``Decode``) over the checkpoint's own decoder."""
    tokens, out = list(eager.initial), []
    cap = min(int(frames / 100.0 * 6), eager.n_text_ctx // 2)
    with torch.no_grad():
        hidden = eager.hidden(mel)
        best = int(eager.logits(torch.tensor([tokens]), hidden).argmax())
        offset = len(tokens)
        for _ in range(cap):
            if best == eager.eot:
                break
            out.append(best)
            tokens.append(best)
            offset += 1
            if offset >= eager.n_text_ctx - 1:
                break
            best = int(eager.logits(torch.tensor([tokens]), hidden).argmax())
    return out


def signals(seconds: Sequence[float] = (1.9, 1.3, 2.6, 0.9), seed: int = 5) -> List[np.ndarray]:
    """A tone with a vibrato, a noise burst, a chirp and a speech-like glide, on the 16-bit grid."""
    rng, rate, out = np.random.default_rng(seed), frontends.SAMPLE_RATE, []
    speech = frontends.utterances(seconds, rate, seed=seed)
    for k, length in enumerate(seconds):
        t = np.arange(int(length * rate)) / rate
        if k % 4 == 0:
            x = 0.4 * np.sin(2 * np.pi * (440 * t + 3 * np.sin(2 * np.pi * 5 * t)))
        elif k % 4 == 1:
            x = 0.3 * rng.standard_normal(t.size) * (np.sin(np.pi * t / length) ** 2)
        elif k % 4 == 2:
            x = 0.4 * np.sin(2 * np.pi * (200 * t + 1500 * t ** 2 / length))
        else:
            x = speech[k]
        out.append((np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32))
    return out


@dataclass(frozen=True)
class _Whisper:
    language: str = ""
    seconds: tuple = (1.9, 1.3, 2.6, 0.9)

    def reference(self, eager: WhisperEager, n_mels: int) -> List[List[int]]:
        """Per utterance: the ids PyTorch decodes (the consumers share them)."""
        return [greedy_ids(eager, *whisper_features(samples, n_mels)) for samples in signals(self.seconds)]

    def wavs(self, folder: str) -> List[str]:
        paths = []
        for k, samples in enumerate(signals(self.seconds)):
            paths.append(os.path.join(folder, f"signal{k}.wav"))
            frontends.write_wav(paths[-1], samples)
        return paths

    def run(self, folder, eager, vocabulary, n_mels, command, ids=None) -> dict:
        """``vocabulary``: the ``WhisperVocabulary`` of tokens.txt; ``ids``: the ``reference`` if computed."""
        ids = ids or self.reference(eager, n_mels)
        symbols = vocabulary.symbols(native=self.native)
        expected = [[symbols[i] for i in decoded if i in symbols] for decoded in ids]
        t0 = time.perf_counter()
        got, by_text = self.untangle(command(self.wavs(folder)), expected, ids, vocabulary)
        report = compare_tokens(self.name, expected, got, t0, note=lambda k: f" (ids {ids[k]})")
        return {**report, "language": self.language, "ids": ids, "distinct": [len(set(i)) for i in ids],
                "unnamed": [sum(i not in symbols for i in decoded) for decoded in ids], "by_text": by_text}

    def untangle(self, got, expected, ids, vocabulary):
        return got, []


@dataclass(frozen=True)
class WhisperPython(_Whisper):
    """sherpa-onnx's Python binding, ``OfflineRecognizer.from_whisper``, all the files in one batch. Its
    ``result.tokens`` raises ``UnicodeDecodeError`` when a decoded piece is not complete UTF-8 alone (byte-level
    pieces of non-Latin scripts; measured with 2.0.1): such an utterance is compared by its ``result.text``
    (the pieces' bytes joined, undecodable bytes dropped) and listed in ``by_text``."""

    name: str = "sherpa-onnx Python OfflineRecognizer.from_whisper"
    native: bool = False

    def available(self) -> Optional[str]:
        return python_missing()

    def verify(self, folder, eager, vocabulary, n_mels, ids=None) -> dict:
        return self.run(folder, eager, vocabulary, n_mels, lambda wavs: json.loads(
            run_child(_SCRIPT, [folder, self.language, *wavs], self.name)), ids)

    def untangle(self, got, expected, ids, vocabulary):
        out, by_text = [], []
        for k, item in enumerate(got):
            if isinstance(item, dict):
                text = b"".join(vocabulary.pieces[i] for i in ids[k] if i in vocabulary.pieces)
                if item["text"] != text.decode("utf-8", "ignore"):
                    raise ConsumerMismatch(self.name, k, repr(text.decode("utf-8", "ignore")), repr(item["text"]),
                                           f" (text: a piece is not complete UTF-8; ids {ids[k]})")
                item, by_text = expected[k], by_text + [k]
            out.append(item)
        return out, by_text


@dataclass(frozen=True)
class WhisperBinary(_Whisper):
    """sherpa-onnx's native ``sherpa-onnx-offline --whisper-encoder ...``, the same files (a one-byte piece above
    0x7F is printed ``<0xC3>``, as ``WhisperVocabulary.symbols(native=True)`` says)."""

    name: str = "sherpa-onnx-offline --whisper-* (native binary)"
    native: bool = True

    def available(self) -> Optional[str]:
        return binary_missing("sherpa-onnx-offline")

    def verify(self, folder, eager, vocabulary, n_mels, ids=None) -> dict:
        def command(wavs):
            flags = [f"--whisper-encoder={folder}/encoder.onnx", f"--whisper-decoder={folder}/decoder.onnx",
                     f"--tokens={folder}/tokens.txt", f"--whisper-language={self.language}",
                     "--whisper-task=transcribe", "--num-threads=1"]
            text = run_program([program("sherpa-onnx-offline"), *flags, *wavs], self.name)
            return [json.loads(line)["tokens"] for line in text.splitlines() if line.startswith("{")]
        return self.run(folder, eager, vocabulary, n_mels, command, ids)
