"""An approximate model against the float ONNX model and the unpatched eager model, at unseen shapes.

The shapes are ``verify``'s (B=1 first, then other batch sizes and lengths
around the export example), drawn with seeds calibration never uses. Every
float output is scored with its measures against both references; lengths
outputs (``output:size1``) must be exactly the eager model's, and frames beyond
them are left out of every measure.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from ..runtimes.compare import valid_mask
from ..runtimes.session import open_session
from ..spec import TensorSpec, dim_sizes, size_name
from ..pipeline.verification import Case, reference_cases

REFERENCES = ("float", "eager")  # the float ONNX model; the unpatched eager model

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
    at: Dict[str, int] = field(default_factory=dict)  # sizes of the worst case
    values: List[float] = field(default_factory=list)  # per checked shape, in order

    def line(self) -> str:
        bound = "exact" if self.threshold is None else f">= {self.threshold:g}"
        return (f"{self.output} {self.measure} vs {self.against}: {self.got:.4g} ({bound}) "
                f"{'ok' if self.ok else 'MISSED'}, worst at {self.at}")


@dataclass
class ApproxResult:
    checks: List[MeasureCheck]
    sizes: List[Dict[str, int]]
    identical: bool = False  # every float output equal to the float model's at every shape: nothing approximated

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def missed(self) -> List[MeasureCheck]:
        """Failed checks, the furthest below its threshold first (relative to the threshold's size)."""
        bad = [c for c in self.checks if not c.ok]
        return sorted(bad, key=lambda c: -(c.threshold - c.got) / max(abs(c.threshold), 1e-9)
                      if c.threshold is not None else -np.inf)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "sizes": self.sizes, "checks": [asdict(c) for c in self.checks]}


def cases_for(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
              seed: int = 1) -> List[Case]:
    """The unseen shapes and the unpatched eager outputs on them (computed once per quantization)."""
    return reference_cases(model, inputs, outputs, example=dim_sizes(inputs), seed=seed)


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


def measure(run: Runner, cases: Sequence[Case], float_outputs: Sequence[Dict[str, np.ndarray]],
            outputs: Sequence[TensorSpec], measures: Mapping[str, list]) -> ApproxResult:
    """Score ``run``'s outputs at every case against the float model's (``float_outputs``, per case) and
    the eager model's; each (output, measure, reference) keeps its worst value."""
    values: Dict[tuple, List[tuple]] = {}
    lengths_wrong: List[MeasureCheck] = []
    identical = True
    for case, float_out in zip(cases, float_outputs):
        got, eager = run({k: v.numpy() for k, v in case.feeds.items()}), eager_outputs(case, outputs)
        for spec in outputs:
            wrong = _lengths_check(spec, got, eager, case.sizes)
            if wrong is not None:
                lengths_wrong.append(wrong)
                continue
            lengths = {axis: eager[size_name(spec.name, axis)] for axis in spec.lengths}
            identical = identical and np.array_equal(got[spec.name], float_out[spec.name])
            for against, ref in (("float", float_out), ("eager", eager)):
                mine, theirs = got[spec.name], ref[spec.name]
                mask = valid_mask(theirs.shape, lengths)
                for m in measures.get(spec.name, ()):
                    values.setdefault((spec.name, m.name, against, m.threshold), []).append(
                        (m.score(mine, theirs, mask), case.sizes))
    checks = lengths_wrong + [_worst(key, found) for key, found in values.items()]
    return ApproxResult(checks, [dict(c.sizes) for c in cases], identical and not lengths_wrong)


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


def _worst(key: tuple, found: List[tuple]) -> MeasureCheck:
    output, name, against, threshold = key
    value, at = min(found, key=lambda v: v[0])
    return MeasureCheck(output, name, against, float(value), threshold, bool(value >= threshold), dict(at),
                        [float(v) for v, _ in found])


def reference_outputs(float_path: str, cases: Sequence[Case]) -> List[Dict[str, np.ndarray]]:
    """The float ONNX model's outputs at every case."""
    run = runner(float_path)
    return [run({k: v.numpy() for k, v in case.feeds.items()}) for case in cases]

