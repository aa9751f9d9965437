"""What sherpa-onnx's FunASR loaders share (SenseVoice and Paraformer, offline): the front end, LFR and CMVN.

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-recognizer-sense-voice-impl.h``,
``offline-recognizer-paraformer-impl.h``, ``lfr.cc``, ``offline-stream.cc``), measured with the 2.0.1 wheel and
sherpa-onnx-bin 2.0.1. sherpa-onnx computes a Kaldi fbank itself with its options forced (Hamming window, mel
banks 20 Hz to Nyquist, ``snip_edges`` on, dither 0, pre-emphasis 0.97, DC removal, 25 / 10 ms), samples times
32768 when ``normalize_samples`` is 0 (Paraformer: always); then LFR -- ``lfr_window_size`` (FunASR's ``lfr_m``)
frames stacked every ``lfr_window_shift`` (``lfr_n``): ``1 + (T - 1) // n`` frames, ``(m - 1) // 2`` copies of
the first frame in front, the last frame repeated past the end (FunASR's ``apply_lfr``) -- then the CMVN
``(x + neg_mean) * inv_stddev`` with the two comma-float metadata vectors, whose length it takes as the feature
width without checking it against anything: a CMVN of another size than ``n_mels * lfr_m`` reads the wrong
numbers. FunASR's ``WavFrontend`` takes these settings from ``config.yaml``'s ``frontend_conf`` and the CMVN from
``am.mvn`` (a Kaldi nnet1 text file: the ``<AddShift>`` vector is ``neg_mean``, the ``<Rescale>`` vector
``inv_stddev``, each read from the ``<LearnRateCoef>`` line after it as ``line.split()[3:-1]``); its ``dither``
defaults to 1.0, sherpa-onnx's to 0, so the reference decodes without dither.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .base import ContractError, Finding

#: frontend_conf keys and the values sherpa-onnx computes with (it forces them; a model trained otherwise would
#: get other features)
SHERPA_FRONT_END = {"fs": 16000, "window": "hamming", "frame_length": 25, "frame_shift": 10, "snip_edges": True}


@dataclass(frozen=True)
class FrontEnd:
    """The model's front end as sherpa-onnx computes it: ``n_mels`` bins, LFR ``lfr_m`` / ``lfr_n``, the CMVN
    vectors as written into the metadata (strings, so the reference reads the very numbers sherpa-onnx parses),
    ``upscale``: samples times 32768 (FunASR's ``upsacle_samples``), ``dither``: FunASR's setting (noted)."""

    n_mels: int
    lfr_m: int
    lfr_n: int
    neg_mean: str
    inv_stddev: str
    upscale: bool = True
    dither: float = 1.0

    @property
    def width(self) -> int:
        return self.n_mels * self.lfr_m

    def cmvn(self) -> Tuple[np.ndarray, np.ndarray]:
        return (np.array([float(v) for v in self.neg_mean.split(",")], np.float32),
                np.array([float(v) for v in self.inv_stddev.split(",")], np.float32))


def read_am_mvn(path: str) -> Tuple[List[float], List[float]]:
    """``(neg_mean, inv_stddev)`` from an ``am.mvn`` as FunASR's ``load_cmvn`` reads it; a file without both
    vectors, or with a number that does not parse, is refused naming the file."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    found: Dict[str, List[float]] = {}
    for i, line in enumerate(lines[:-1]):
        head = line.split()[:1]
        nxt = lines[i + 1].split()
        if head and head[0] in ("<AddShift>", "<Rescale>") and nxt[:1] == ["<LearnRateCoef>"]:
            try:
                found[head[0]] = [float(v) for v in nxt[3:-1]]
            except ValueError as exc:
                raise ContractError("sherpa-onnx/funasr", [Finding(f"cmvn {path!r} {head[0]}", "numbers",
                                                                    str(exc))]) from exc
    missing = [k for k in ("<AddShift>", "<Rescale>") if k not in found]
    if missing:
        raise ContractError("sherpa-onnx/funasr", [Finding(f"cmvn {path!r}", "a Kaldi nnet text file with an "
                                                           "<AddShift> and a <Rescale> vector (FunASR's am.mvn)",
                                                           f"no {', '.join(missing)}")])
    return found["<AddShift>"], found["<Rescale>"]


def _floats(values: Sequence[float]) -> str:
    """Comma floats as sherpa-onnx's ``SplitStringToFloats`` reads them (float32, shortest exact text)."""
    return ",".join(repr(float(np.float32(v))) for v in values)


def front_end(contract: str, conf: Mapping[str, object], cmvn: Union[str, os.PathLike, Tuple[Sequence[float],
              Sequence[float]]], width: Optional[int] = None) -> FrontEnd:
    """The model's ``frontend_conf`` and CMVN (an ``am.mvn`` path, or ``(neg_mean, inv_stddev)``) checked against
    what sherpa-onnx computes; ``width``: the graph's feature width, when known. One ``ContractError`` with every
    finding."""
    found: List[Finding] = []
    ints = {}
    for key in ("n_mels", "lfr_m", "lfr_n"):
        value = conf.get(key, 80 if key == "n_mels" else 1)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            found.append(Finding(f"frontend_conf {key!r}", "a positive int", repr(value)))
        ints[key] = value
    for key, want in SHERPA_FRONT_END.items():
        if key in conf and conf[key] != want:
            found.append(Finding(f"frontend_conf {key!r}", f"{want!r} (sherpa-onnx computes its fbank so)",
                                 repr(conf[key])))
    if found:
        raise ContractError(contract, found)
    if isinstance(cmvn, (str, os.PathLike)):
        neg_mean, inv_stddev = read_am_mvn(os.fspath(cmvn))
        where = f"cmvn {os.fspath(cmvn)!r}"
    else:
        neg_mean, inv_stddev = (list(v) for v in cmvn)
        where = "cmvn"
    size = ints["n_mels"] * ints["lfr_m"]
    for name, vector in (("neg_mean", neg_mean), ("inv_stddev", inv_stddev)):
        if len(vector) != size:
            found.append(Finding(f"{where} {name}", f"{size} values (n_mels {ints['n_mels']} x lfr_m "
                                 f"{ints['lfr_m']}: sherpa-onnx takes its length as the feature width)",
                                 f"{len(vector)}"))
        elif not np.all(np.isfinite(vector)):
            found.append(Finding(f"{where} {name}", "finite values", "inf or nan"))
    if width is not None and width != size:
        found.append(Finding("input 0 dim 2", f"{size} (n_mels x lfr_m)", str(width)))
    if found:
        raise ContractError(contract, found)
    return FrontEnd(ints["n_mels"], ints["lfr_m"], ints["lfr_n"], _floats(neg_mean), _floats(inv_stddev),
                    bool(conf.get("upsacle_samples", True)), float(conf.get("dither", 1.0)))


def front_end_metadata(front: FrontEnd) -> Dict[str, str]:
    return {"lfr_window_size": str(front.lfr_m), "lfr_window_shift": str(front.lfr_n),
            "neg_mean": front.neg_mean, "inv_stddev": front.inv_stddev}


def front_end_findings(meta: Mapping[str, str], front: FrontEnd) -> List[Finding]:
    """The metadata's LFR and CMVN (a user's values included) against the model's front end."""
    want = front_end_metadata(front)
    found = []
    for key in ("lfr_window_size", "lfr_window_shift"):
        if meta.get(key) != want[key]:
            found.append(Finding(f"metadata {key!r}", f"{want[key]} (the model's frontend_conf)", repr(meta.get(key))))
    for key in ("neg_mean", "inv_stddev"):
        try:
            values = [float(v) for v in meta.get(key, "").split(",")]
        except ValueError:
            values = []
        if len(values) != front.width:
            found.append(Finding(f"metadata {key!r}", f"{front.width} comma floats (n_mels x lfr_m)",
                                 f"{len(values)} values"))
    return found


def sherpa_fbank(samples: np.ndarray, front: FrontEnd, upscale: bool) -> np.ndarray:
    """``[T, n_mels]``: kaldi-native-fbank with the options sherpa-onnx's FunASR loaders force."""
    from .frontends import _fbank
    import kaldi_native_fbank as knf
    o = knf.FbankOptions()
    o.frame_opts.samp_freq = 16000
    o.frame_opts.dither = 0
    o.frame_opts.snip_edges = True
    o.frame_opts.window_type = "hamming"
    o.mel_opts.num_bins = front.n_mels
    o.mel_opts.low_freq = 20
    o.mel_opts.high_freq = 0
    return _fbank(samples * 32768 if upscale else samples, o)


def apply_lfr(x: np.ndarray, m: int, n: int) -> np.ndarray:
    """sherpa-onnx's ``ApplyLfr`` (= FunASR's ``apply_lfr``): ``[T, D]`` -> ``[1 + (T - 1) // n, m * D]``."""
    frames = x.shape[0]
    left = (m - 1) // 2
    out = np.empty((1 + (frames - 1) // n, m * x.shape[1]), np.float32)
    for i in range(out.shape[0]):
        idx = np.clip(np.arange(m) + i * n - left, 0, frames - 1)
        out[i] = x[idx].reshape(-1)
    return out


def features(samples: np.ndarray, front: FrontEnd, upscale: bool) -> np.ndarray:
    """``[T', n_mels * lfr_m]`` as sherpa-onnx feeds the FunASR graph: fbank, LFR, CMVN (float32 throughout)."""
    neg_mean, inv_stddev = front.cmvn()
    x = apply_lfr(sherpa_fbank(samples, front, upscale), front.lfr_m, front.lfr_n)
    return ((x + neg_mean) * inv_stddev).astype(np.float32)


def sherpa_symbol(piece: str) -> str:
    """How sherpa-onnx says a tokens.txt symbol (``SymbolTable::operator[]``): a leading ``▁`` becomes a space
    (the tables here are not byte-level BPE)."""
    return " " + piece[1:] if len(piece.encode()) >= 3 and piece.startswith("▁") else piece


def vocabulary_findings(vocabulary: Sequence[str], classes: int) -> List[Finding]:
    """tokens.txt is ``symbol id`` per line: one symbol per class of the logits, each a non-empty word (a symbol
    with whitespace splits into fields sherpa-onnx refuses), no symbol twice (it maps symbols to ids)."""
    found = []
    if len(vocabulary) != classes:
        found.append(Finding("vocabulary", f"{classes} symbols (the logits' classes)", str(len(vocabulary))))
    bad = [s for s in vocabulary if not isinstance(s, str) or not s or any(c.isspace() for c in s)]
    if bad:
        found.append(Finding("vocabulary symbols", "non-empty strings without whitespace", f"{bad[:3]}"))
    dupes = sorted({s for s in vocabulary if isinstance(s, str) and list(vocabulary).count(s) > 1})
    if dupes:
        found.append(Finding("vocabulary symbols", "unique", f"{dupes[:3]} repeated"))
    return found


def tokens_text(vocabulary: Sequence[str]) -> str:
    return "".join(f"{s} {i}\n" for i, s in enumerate(vocabulary))


def graph_findings(graph, proto, meta, front: FrontEnd):
    """A FunASR graph's ports by position (``graph``: the family's ``Contract``), then its feature width against
    the front end's ``n_mels x lfr_m``: ``(findings, classes)``, ``classes`` (the logits' width, which the family's
    metadata findings read) ``None`` when the ports themselves are wrong."""
    from ..graph import value_info
    try:
        graph.check(proto, None, meta)
    except ContractError as exc:
        return list(exc.findings), None
    found: List[Finding] = []
    width = value_info(proto.graph.input[0])["dims"][2]
    if width != front.width:
        found.append(Finding("input 0 dim 2", f"{front.width} (n_mels x lfr_m)", str(width)))
    return found, value_info(proto.graph.output[0])["dims"][2]
