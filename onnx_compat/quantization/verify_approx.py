"""An approximate model against the float ONNX model and the unpatched eager model, at unseen shapes.

The shapes are ``verify``'s (B=1 first, then other batch sizes and lengths
around the export example) and one more batch size, drawn with seeds
calibration never uses. Every float output is scored with its measures against
both references; lengths outputs (``output:size1``) must be exactly the eager
model's, and frames beyond them are left out of every measure.

Why several draws per shape: a task measure (top-1, CTC agreement) counts
frames, and a shape of 23 frames moves top-1 by 0.043 per frame that differs
(one frame decided a 0.9565 against a threshold of 0.95, where the same model
scored 0.939 at B=3, T=120). So each shape is drawn again, with new inputs at the
same sizes, until it holds ``FRAMES`` valid frames of every output a task
measure reads (at most ``MAX_DRAWS`` draws); a measure is scored once per shape
over all its draws taken together, and the threshold holds for the worst shape.
Each check keeps every shape's value and frame count (``per_shape``).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import torch

from ..runtimes.compare import valid_mask
from ..runtimes.session import open_session
from ..spec import TensorSpec, dim_sizes, size_name, verification_sizes
from ..pipeline.verification import Case, reference_cases

REFERENCES = ("float", "eager")  # the float ONNX model; the unpatched eager model
SHAPES = 4  # verify's three shapes (B=1 first) and a fourth batch size
FRAMES = 360  # valid frames per shape a task measure is scored on, at least (top-1 sampling error ~0.011 at 0.95)
MAX_DRAWS = 16  # inputs drawn per shape at most (a B=1 shape of a subsampling encoder gives few frames each)
MORE_SEED = 100  # seeds of the further draws: 100.., far from verify's 1.. and calibration's 1000..

Runner = Callable[[Dict[str, np.ndarray]], Dict[str, np.ndarray]]


@dataclass
class MeasureCheck:
    """One measure of one output against one reference, worst over the checked shapes."""

    output: str
    measure: str
    against: str
    got: float
    threshold: Optional[float]
    ok: bool
    at: Dict[str, int] = field(default_factory=dict)  # sizes of the worst shape
    values: List[float] = field(default_factory=list)  # per checked shape, in order
    per_shape: List[dict] = field(default_factory=list)  # {"sizes", "value", "frames", "draws"} per checked shape

    def line(self) -> str:
        bound = "exact" if self.threshold is None else f">= {self.threshold:g}"
        return (f"{self.output} {self.measure} vs {self.against}: {self.got:.4g} ({bound}) "
                f"{'ok' if self.ok else 'MISSED'}, worst at {self.at}")


@dataclass
class ApproxResult:
    checks: List[MeasureCheck]
    sizes: List[Dict[str, int]]  # the checked shapes, each once
    identical: bool = False  # every float output equal to the float model's at every shape: nothing approximated
    draws: List[int] = field(default_factory=list)  # inputs drawn at each shape of ``sizes``

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def missed(self) -> List[MeasureCheck]:
        """Failed checks, the furthest below its threshold first (relative to the threshold's size)."""
        bad = [c for c in self.checks if not c.ok]
        return sorted(bad, key=lambda c: -(c.threshold - c.got) / max(abs(c.threshold), 1e-9)
                      if c.threshold is not None else -np.inf)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "sizes": self.sizes, "draws": self.draws, "checks": [asdict(c) for c in self.checks]}


def cases_for(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
              seed: int = 1, counted: Sequence[str] = ()) -> List[Case]:
    """The unseen shapes and the unpatched eager outputs on them (computed once per quantization).
    ``counted``: the outputs a task measure reads; each shape is drawn again until it holds ``FRAMES``
    valid frames of each (at most ``MAX_DRAWS`` draws), the number of draws set by the first one."""
    sizes = verification_sizes(inputs, dim_sizes(inputs), count=SHAPES)
    with one_thread():
        cases = reference_cases(model, inputs, outputs, sizes=sizes, seed=seed)
        more = []
        for case in cases if counted else ():
            each = frames_in(case, outputs, counted)
            more += [dict(case.sizes)] * (min(MAX_DRAWS, -(-FRAMES // max(each, 1))) - 1)
        return cases + (reference_cases(model, inputs, outputs, sizes=more, seed=seed + MORE_SEED) if more else [])


@contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch on one thread for the duration (put back after): the reference runs are many small calls, each
    paying the thread pool's wake-up; on the loaded 2-core machine 52 runs of the tiny Conformer took 7 to 11 s
    on two threads and 0.3 to 0.4 s on one (``label_scorers.managed_search.eager_call`` measured the same)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def frames_in(case: Case, outputs: Sequence[TensorSpec], names: Sequence[str]) -> int:
    """The fewest valid frames of the outputs ``names`` in the eager outputs of ``case``."""
    eager = eager_outputs(case, outputs)
    found = [frame_count(valid_mask(eager[s.name].shape, {a: eager[size_name(s.name, a)] for a in s.lengths}))
             for s in outputs if s.name in names]
    return min(found, default=0)


def frame_count(mask: np.ndarray) -> int:
    """Valid frames of an output's mask: ``[B, T, ...]`` positions (b, t) valid throughout, or items of
    ``[B, C]`` (a classifier's frame is its item)."""
    if mask.ndim >= 3:
        return int(mask.reshape(mask.shape[0], mask.shape[1], -1).all(-1).sum())
    return int(mask.shape[0]) if mask.ndim else 1


def runner(path: str, threads: int = 1) -> Runner:
    """Run the ONNX model at ``path``: feeds cast to its declared input types, float outputs as float32."""
    sess = open_session(path, threads=threads)
    types = {i.name: _numpy_type(i.type) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]

    def run(feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        got = sess.run(None, {k: np.asarray(v).astype(types[k], copy=False) for k, v in feeds.items() if k in types})
        return {n: (g.astype(np.float32) if g.dtype == np.float16 else g) for n, g in zip(names, got)}
    return run


def _numpy_type(onnx_type: str):
    return {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
            "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_}.get(onnx_type, None)


def eager_outputs(case: Case, outputs: Sequence[TensorSpec]) -> Dict[str, np.ndarray]:
    names = [n for spec in outputs for n in spec.onnx_names]
    return dict(zip(names, case.expected))


def measure(run: Runner, cases: Sequence[Case], float_outputs: Optional[Sequence[Dict[str, np.ndarray]]],
            outputs: Sequence[TensorSpec], measures: Mapping[str, list]) -> ApproxResult:
    """Score ``run``'s outputs against the float model's (``float_outputs``, per case; None: against eager
    only) and the eager model's, each measure once per shape over all its draws; each (output, measure,
    reference) keeps its worst shape."""
    shapes: Dict[tuple, dict] = {}  # sizes -> {"sizes", "draws", (output, against) -> [(got, ref, mask)]}
    lengths_wrong: List[MeasureCheck] = []
    identical = True
    for case, float_out in zip(cases, float_outputs or [None] * len(cases)):
        got, eager = run({k: v.numpy() for k, v in case.feeds.items()}), eager_outputs(case, outputs)
        shape = shapes.setdefault(tuple(sorted(case.sizes.items())), {"sizes": dict(case.sizes), "draws": 0})
        shape["draws"] += 1
        for spec in outputs:
            wrong = _lengths_check(spec, got, eager, case.sizes)
            if wrong is not None:
                lengths_wrong.append(wrong)
                continue
            lengths = {axis: eager[size_name(spec.name, axis)] for axis in spec.lengths}
            identical = identical and float_out is not None and np.array_equal(got[spec.name], float_out[spec.name])
            for against, ref in (("float", float_out), ("eager", eager)):
                if ref is not None:
                    mask = valid_mask(ref[spec.name].shape, lengths)
                    shape.setdefault((spec.name, against), []).append((got[spec.name], ref[spec.name], mask))
    values: Dict[tuple, List[dict]] = {}
    for shape in shapes.values():
        for key, arrays in shape.items():
            if not isinstance(key, tuple):
                continue
            mine, theirs, mask = _joined(arrays)
            for m in measures.get(key[0], ()):
                values.setdefault((key[0], m.name, key[1], m.threshold), []).append(
                    {"sizes": shape["sizes"], "value": float(m.score(mine, theirs, mask)),
                     "frames": frame_count(mask), "draws": len(arrays)})
    checks = lengths_wrong + [_worst(key, found) for key, found in values.items()]
    return ApproxResult(checks, [s["sizes"] for s in shapes.values()], identical and not lengths_wrong,
                        [s["draws"] for s in shapes.values()])


def _joined(arrays: List[tuple]) -> tuple:
    """The draws of one shape as one batch: outputs, references and masks joined on axis 0 (an axis that
    differs between draws is padded, the padding masked out)."""
    if len(arrays) == 1:
        return arrays[0]
    widest = np.max([a[1].shape for a in arrays], axis=0)
    joined = []
    for k in range(3):
        parts = []
        for a in arrays:
            pad = [(0, 0)] + [(0, int(w - n)) for w, n in zip(widest[1:], a[k].shape[1:])]
            parts.append(np.pad(a[k], pad) if any(p for _, p in pad) else a[k])
        joined.append(np.concatenate(parts, axis=0))
    return tuple(joined)


def _lengths_check(spec: TensorSpec, got, eager, sizes) -> Optional[MeasureCheck]:
    """Shape and lengths must be exact: a check that failed, or None."""
    for axis in spec.lengths:
        name = size_name(spec.name, axis)
        if name not in got or not np.array_equal(np.asarray(got[name]), eager[name]):
            differ = -1 if name not in got else int(np.sum(np.asarray(got[name]) != eager[name]))
            return MeasureCheck(name, "lengths", "eager", float(differ), None, False, dict(sizes))
    if spec.name not in got or got[spec.name].shape != eager[spec.name].shape:
        return MeasureCheck(spec.name, "shape", "eager", -1.0, None, False, dict(sizes))
    return None


def _worst(key: tuple, found: List[dict]) -> MeasureCheck:
    output, name, against, threshold = key
    worst = min(found, key=lambda v: v["value"])
    return MeasureCheck(output, name, against, worst["value"], threshold, bool(worst["value"] >= threshold),
                        dict(worst["sizes"]), [v["value"] for v in found], found)


def reference_outputs(float_path: str, cases: Sequence[Case]) -> List[Dict[str, np.ndarray]]:
    """The float ONNX model's outputs at every case."""
    run = runner(float_path)
    return [run({k: v.numpy() for k, v in case.feeds.items()}) for case in cases]



def verify_quantized(path, model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                     measures=None, thresholds: Optional[Mapping[str, float]] = None) -> ApproxResult:
    """A quantized file checked as ``quantize`` checked it, against the unpatched eager model at unseen shapes:
    the measures and thresholds the file records (``recorded.py``), or those given (``measures``,
    ``thresholds`` as ``quantize`` takes them). What ``verify`` points to when a file that records a recipe
    misses its ``atol``. Raises ``QuantizationError`` naming the worst measure missed (output, shape, value)."""
    from . import measures as measures_mod, recorded
    from .errors import QuantizationError
    found = recorded.read(path) or {}
    specs = [outputs] if isinstance(outputs, TensorSpec) else list(outputs)
    inputs = [inputs] if isinstance(inputs, TensorSpec) else list(inputs)
    if measures is None and found.get("measures"):
        measures = {o: list(ms) for o, ms in found["measures"].items()}
        thresholds = {**{f"{o}/{m}": t for o, ms in found["measures"].items() for m, t in ms.items()},
                      **dict(thresholds or {})}
    floats = [s.name for s in specs if s.dtype.is_floating_point]
    chosen = measures_mod.resolve(measures, thresholds, floats, found.get("recipe"),
                                  class_outputs=measures_mod.class_outputs(specs))
    counted = [o for o, ms in chosen.items() if any(m.task for m in ms)]
    result = measure(runner(os.fspath(path)), cases_for(model, inputs, specs, counted=counted), None, specs, chosen)
    if not result.ok:
        worst = result.missed()[0]
        bound = "exact" if worst.threshold is None else f">= {worst.threshold:g}"
        raise QuantizationError(f"{path}: output {worst.output!r} {worst.measure} against eager is {worst.got:.4g} "
                                f"({bound}) at sizes {worst.at}", recipe=found.get("recipe"), measure=worst.measure,
                                got=worst.got, threshold=worst.threshold, output=worst.output)
    return result
