"""How close an approximate output is to its reference: per-output signal measures and task measures.

A quantized model is meant to differ from the float one, so ``atol`` proves
nothing about it. Each measure scores one output against a reference (the
float ONNX model, or the unpatched eager model) on the valid frames only
(frames beyond each sequence's length are masked out, as ``verify`` does), and
higher is better for every one of them, so a threshold is a lower bound.

Signal measures fit every float output: ``snr`` (dB, as ONNX Runtime's QDQ
debugging tools compute it) and ``cosine``. Task measures read an output as
per-frame class scores ``[B, T, C]`` (classes last, time on axis 1) and are
chosen by name: ``top1`` (share of valid frames whose best class agrees) and
``ctc`` (greedy CTC decoding of both, blank 0 unless ``ctc:blank=K``; one minus
the token edit distance over the reference's token count). On log-probs the
SNR is high whatever happens (the log-softmax offset dominates the signal):
the task measure is the one that speaks for recognition.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

from .errors import QuantizationError


@dataclass(frozen=True)
class Snr:
    """Signal-to-noise ratio in dB: 20·log10(‖ref‖ / ‖ref − got‖) over the valid values."""

    name: str = "snr"
    threshold: float = 20.0
    task: bool = False
    best: float = math.inf  # identical outputs

    def score(self, got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
        return snr_db([ref[mask]], [got[mask]])


def snr_db(reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """ONNX Runtime's SNR (dB) of ``got`` against ``reference`` (lists of arrays taken together); identical
    values (zeros, nothing at all) are +inf rather than its epsilon floor, non-finite ones -inf."""
    ref = [np.asarray(r, dtype=np.float64).ravel() for r in reference]
    out = [np.asarray(g, dtype=np.float64).ravel() for g in got]
    if not all(np.isfinite(g).all() for g in out):
        return -math.inf
    if all(np.array_equal(r, g) for r, g in zip(ref, out)):
        return math.inf
    return float(compute_signal_to_quantization_noice_ratio(ref, out))


@dataclass(frozen=True)
class Cosine:
    """Cosine similarity of the valid values taken as one vector (1 = same direction)."""

    name: str = "cosine"
    threshold: float = 0.99
    task: bool = False
    best: float = 1.0

    def score(self, got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
        g, r = got[mask].astype(np.float64), ref[mask].astype(np.float64)
        norms = np.linalg.norm(g) * np.linalg.norm(r)
        if norms == 0:
            return 1.0 if np.array_equal(g, r) else 0.0
        return float(np.dot(g, r) / norms)


def _frames(scores: np.ndarray, mask: np.ndarray) -> List[np.ndarray]:
    """Each sequence's best class per valid frame (``scores`` ``[B, T, C]``)."""
    best = scores.argmax(-1)
    valid = mask.reshape(mask.shape[0], mask.shape[1], -1).all(-1)
    return [best[b][valid[b]] for b in range(best.shape[0])]


@dataclass(frozen=True)
class Top1Agreement:
    """Share of valid frames whose top-1 class is the reference's."""

    name: str = "top1"
    threshold: float = 0.95
    task: bool = True
    best: float = 1.0

    def score(self, got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
        if got.ndim == 2:  # a classifier's [B, C]: one frame per item
            got, ref, mask = got[:, None], ref[:, None], mask[:, None]
        pairs = list(zip(_frames(got, mask), _frames(ref, mask)))
        frames = sum(r.size for _, r in pairs)
        return float(sum(int((g == r).sum()) for g, r in pairs) / frames) if frames else 1.0


def greedy_ctc(labels: np.ndarray, blank: int) -> List[int]:
    """Best path decoding: repeats merged, then blanks dropped."""
    if labels.size == 0:
        return []
    keep = np.ones(labels.size, dtype=bool)
    keep[1:] = labels[1:] != labels[:-1]
    return [int(t) for t in labels[keep] if t != blank]


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


@dataclass(frozen=True)
class CtcAgreement:
    """1 − (token edits between both greedy CTC decodings) / (reference tokens), floored at 0."""

    name: str = "ctc"
    threshold: float = 0.9
    task: bool = True
    best: float = 1.0
    blank: int = 0

    def score(self, got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
        pairs = [(greedy_ctc(g, self.blank), greedy_ctc(r, self.blank))
                 for g, r in zip(_frames(got, mask), _frames(ref, mask))]
        tokens = sum(len(r) for _, r in pairs)
        edits = sum(edit_distance(r, g) for g, r in pairs)
        if tokens == 0:
            return 1.0 if edits == 0 else 0.0
        return max(0.0, 1.0 - edits / tokens)


MEASURES = (Snr(), Cosine(), Top1Agreement(), CtcAgreement())
DEFAULT = ("snr", "cosine")
Measure = Union[Snr, Cosine, Top1Agreement, CtcAgreement]


def by_name(name: str, recipe: Optional[str] = None) -> Measure:
    """``"snr"``, ``"cosine"``, ``"top1"``, ``"ctc"`` or ``"ctc:blank=K"``."""
    base, _, option = name.partition(":")
    found = next((m for m in MEASURES if m.name == base), None)
    if found is None:
        raise QuantizationError(f"unknown measure {name!r}; choose from {[m.name for m in MEASURES]} "
                                "(ctc takes ctc:blank=K)", recipe=recipe, measure=name)
    if option:
        key, _, value = option.partition("=")
        if not isinstance(found, CtcAgreement) or key != "blank" or not value.isdigit():
            raise QuantizationError(f"measure {name!r}: only ctc takes an option, as ctc:blank=K",
                                    recipe=recipe, measure=name)
        found = replace(found, name=name, blank=int(value))
    return found


def resolve(measures, thresholds: Optional[Mapping[str, float]], float_outputs: Sequence[str],
            recipe: Optional[str] = None, class_outputs: Sequence[str] = ()) -> Dict[str, List[Measure]]:
    """The measures per float output: ``measures`` is a list of names for every output, or
    ``{output: [names]}``; ``thresholds`` ``{measure: value}`` or ``{"output/measure": value}``. By default
    (``measures=None``) snr and cosine, and top1 too for ``class_outputs`` (log-probs, class scores): on
    log-probs the SNR stays high whatever the best class does."""
    if measures is None:  # class scores (log-probs, logits) are also read by their best class
        chosen = {o: list(DEFAULT) + (["top1"] if o in class_outputs else []) for o in float_outputs}
    else:
        chosen = dict(measures) if isinstance(measures, Mapping) else {o: list(measures) for o in float_outputs}
    unknown = [o for o in chosen if o not in float_outputs]
    if unknown:
        raise QuantizationError(f"measures name output(s) {unknown}; the model's float outputs are "
                                f"{list(float_outputs)}", recipe=recipe, output=unknown[0])
    thresholds = dict(thresholds or {})
    resolved = {o: [m if not isinstance(m, str) else by_name(m, recipe) for m in names] for o, names in chosen.items()}
    used = set()
    for output, items in resolved.items():
        for k, m in enumerate(items):
            key = next((t for t in (f"{output}/{m.name}", m.name) if t in thresholds), None)
            if key is not None:
                used.add(key)
                items[k] = replace(m, threshold=float(thresholds[key]))
    for output, items in resolved.items():
        for m in items:
            if not (math.isfinite(m.threshold) and m.threshold <= m.best):
                raise QuantizationError(f"threshold {m.threshold} for {m.name} on {output!r} cannot be met: "
                                        f"{m.name} is at most {m.best} (identical outputs) and must be finite",
                                        recipe=recipe, measure=m.name, threshold=m.threshold, output=output)
    stray = sorted(set(thresholds) - used)
    if stray:
        raise QuantizationError(f"thresholds {stray} name no measure in use ({_in_use(resolved)})",
                                recipe=recipe, measure=stray[0])
    return resolved


CLASS_NAMES = re.compile(r"logit|log_?prob|prob|class|score", re.IGNORECASE)
CLASS_OPS = ("LogSoftmax", "Softmax")


def class_outputs(outputs, graph=None) -> List[str]:
    """Float outputs read as class scores: ``[B, C]`` or ``[B, T, C]`` with a fixed class count, made by a
    (Log)Softmax in ``graph`` (an ``onnx.GraphProto``, when known) or named like scores (logits, log_probs)."""
    made_by = {o: n.op_type for n in (graph.node if graph is not None else ()) for o in n.output}
    found = []
    for spec in outputs:
        last = spec.dims[-1] if spec.dims else None
        if not spec.dtype.is_floating_point or len(spec.dims) not in (2, 3) or not isinstance(last, int) or last < 2:
            continue
        if made_by.get(spec.name) in CLASS_OPS or CLASS_NAMES.search(spec.name):
            found.append(spec.name)
    return found


def _in_use(resolved: Mapping[str, List[Measure]]) -> str:
    return "; ".join(f"{o}: {[m.name for m in ms]}" for o, ms in resolved.items())
