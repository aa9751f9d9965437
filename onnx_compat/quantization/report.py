"""What a quantization did and how close the result stayed, as a Python object and as JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from ..pipeline.report import duration


@dataclass
class QuantReport:
    recipe: str
    about: str = ""
    path: Optional[str] = None  # the approximate model written
    float_path: Optional[str] = None  # the proven float model it was made from (left as it was)
    float_report: Optional[str] = None  # the float model's verification report (its JSON path, or "in memory")
    bytes: Dict[str, float] = field(default_factory=dict)  # float, quantized, ratio
    calibration: Optional[str] = None  # what the static recipes were calibrated on
    measures: Dict[str, List[str]] = field(default_factory=dict)  # output -> ["snr >= 20", ...]
    verification: dict = field(default_factory=dict)  # verify_approx.ApproxResult.to_dict()
    excluded: List[dict] = field(default_factory=list)  # nodes left in float32 by automatic exclusion
    exclusion_cost: Optional[dict] = None  # bytes added and the quality before/after
    # medians of interleaved runs against the float model: float_s, quantized_s, ratio, rounds, threads, sizes
    latency: Optional[dict] = None
    float_weights: Optional[float] = None  # share of the weight values still float32 in the model written
    warnings: List[str] = field(default_factory=list)  # slower than float, most weights left in float
    messages: List[str] = field(default_factory=list)  # what ONNX Runtime's tools logged (logs.py), once each
    timings: Dict[str, float] = field(default_factory=dict)
    # recipe="auto": the target runtime, why this recipe, and each candidate's row (auto.tried_entry)
    target: Optional[str] = None
    chosen_by: Optional[str] = None
    tried: List[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        return text

    def summary(self) -> str:
        """A few lines for a terminal."""
        b = self.bytes
        lines = [f"recipe      {self.recipe} ({self.about})",
                 f"written     {self.path} ({b.get('quantized', 0) / 1e3:.1f} kB, {b.get('ratio', 0):.2f} of the float "
                 f"model's {b.get('float', 0) / 1e3:.1f} kB at {self.float_path})"]
        if self.calibration:
            lines.append(f"calibrated  on {self.calibration}")
        draws = self.verification.get("draws") or []
        sizes = ", ".join(f"{s}" + (f" x{d} draws" if d > 1 else "")
                          for s, d in zip(self.verification.get("sizes", []), draws or [1] * 99))
        lines.append(f"verified    at {sizes}")
        for c in self.verification.get("checks", []):
            bound = "exact" if c["threshold"] is None else f">= {c['threshold']:g}"
            lines.append(f"  {c['output']:<14} {c['measure']:<8} vs {c['against']:<5} {c['got']:.4g} ({bound}) "
                         f"{'ok' if c['ok'] else 'MISSED'}{per_shape(c.get('per_shape') or [])}")
        for node in self.excluded:
            lines.append(f"excluded    {', '.join(node['nodes'])} (at {node['where']}: adds noise "
                         f"{node['added_noise']:.2e})")
        if self.exclusion_cost:
            lines.append("cost        " + ", ".join(f"{k} {v}" for k, v in self.exclusion_cost.items()))
        if self.latency:
            lat = self.latency
            lines.append(f"latency     {lat['quantized_s'] * 1e3:.3g} ms vs float {lat['float_s'] * 1e3:.3g} ms: "
                         f"{lat['ratio']:.2f}x (median of {lat['rounds']} interleaved runs, {lat['threads']} thread, "
                         f"at {lat.get('sizes')})")
        if self.chosen_by:
            lines.append(f"chosen      {self.chosen_by}")
        for t in self.tried:
            lines.append("  " + tried_line(t))
        if self.float_weights is not None:
            lines.append(f"float32     {self.float_weights:.0%} of the weight values")
        lines += [f"warning     {w}" for w in self.warnings]
        lines += [f"ort logged  {m}" for m in self.messages]
        lines.append("time        " + ", ".join(f"{k} {duration(v)}" for k, v in self.timings.items()))
        return "\n".join(lines)


def per_shape(values) -> str:
    """A check's value at each shape it was scored at, with the frames it counted (the worst is the check's)."""
    if len(values) < 2:
        return ""
    return "; per shape " + ", ".join(f"{'x'.join(str(n) for n in v['sizes'].values())} {v['value']:.4g} "
                                      f"({v['frames']} frames)" for v in values)


def tried_line(t: dict) -> str:
    """One candidate of ``auto``: its size and latency against float and its worst measures, or why it was
    dropped."""
    if not t["ok"]:
        why = t["why"] or ""
        return f"{t['recipe']:<18} {why if why.startswith('not a candidate') else 'dropped: ' + why}"
    lat, size = t["latency"], t["bytes"]
    worst = ", ".join(f"{k} {v:.4g}" for k, v in t["measures"].items())
    return (f"{t['recipe']:<18} {size['ratio']:.2f} of the size, {lat['ratio']:.2f}x the float time "
            f"({lat['quantized_s'] * 1e3:.3g} vs {lat['float_s'] * 1e3:.3g} ms); {worst}")
