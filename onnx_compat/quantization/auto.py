"""``recipe="auto"``: the recipes that suit the target runtime, each made and verified, then timed together
against the float model; the fastest that meets every threshold is kept, and one slower than float never is.

Why: no recipe is faster everywhere. On a 1.8 M-parameter Transformer at one
thread int8-static ran 1.11x and fp16 1.13x the float model's time while
int8-dynamic ran 0.75x; which one pays depends on the model, the runtime and
the machine, so it is measured, not assumed. All candidates that met their
thresholds and the float model run in one interleaved loop (``latency``), so
the machine's load hits every one alike and their ratios compare. When none
is faster than float, nothing is written and the error lists what each did:
a smaller file that is slower is a choice the user makes by naming a recipe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import QuantizationError

AUTO = "auto"
ROUNDS = 15  # interleaved runs of each candidate and the float model (more than one recipe's 7: ratios are compared)
FASTER = 1.0  # a candidate is kept only below this ratio of the float model's time

# runtime -> the recipes it has kernels for that can pay in time, cheapest to make first. CPU ONNX Runtime:
# dynamic int8 (MatMulInteger/ConvInteger, DynamicQuantizeLSTM: the BLSTM ran 0.45x float with it), static
# QDQ (fused into int8 kernels), float16 (where CPU kernels exist; the fp16 recipe keeps the rest float32).
# Per-channel variants are left out: they cost the same to run as their per-tensor recipe and are for
# accuracy, which a recipe named by the user gives.
TARGETS = {
    "onnxruntime": ("int8-dynamic", "int8-dynamic-conv", "int8-dynamic-all", "int8-static", "fp16"),
}
DEFAULT_TARGET = "onnxruntime"


@dataclass(frozen=True)
class Plan:
    """What ``auto`` will try: the recipes for ``target``. It stands in for a recipe in the checks before any
    work (``name``; ``calibrated``: a static candidate needs calibration inputs)."""

    target: str
    candidates: Tuple[str, ...]
    name: str = AUTO
    calibrated: bool = True


def plan(target: Optional[str] = None) -> Plan:
    """The recipes ``auto`` tries for ``target`` (``"onnxruntime"``, or an ``"onnxruntime==X.Y"`` release: the
    same CPU kernels). Any other runtime is a ``QuantizationError`` naming the ones known."""
    from . import recipes
    text = DEFAULT_TARGET if target is None else target
    runtime = text.split("==")[0].strip() if isinstance(text, str) else None
    if runtime not in TARGETS:
        raise QuantizationError(f"quantize target {target!r}: auto knows the recipes of {sorted(TARGETS)} "
                                "(name a recipe to quantize for another runtime)", recipe=AUTO)
    if "==" in text:
        from ..pipeline.releases import parse_target
        try:
            parse_target(text)
        except ValueError as exc:
            raise QuantizationError(f"quantize target: {exc}", recipe=AUTO) from exc
    for name in TARGETS[runtime]:
        recipes.by_name(name)  # a table naming a recipe that is gone fails here, not after the export
    return Plan(text, TARGETS[runtime])


def tried_entry(recipe: str, report=None, error: Optional[QuantizationError] = None) -> dict:
    """One row of the report's ``tried``: the recipe's size, latency against float and measures, or why it
    was dropped before timing."""
    if report is None:
        return {"recipe": recipe, "ok": False, "why": str(error), "bytes": None, "latency": None, "measures": {}}
    worst: dict = {}  # output/measure -> the lower of its values against the float model and against eager
    for c in report.verification.get("checks", []):
        key = f"{c['output']}/{c['measure']}"
        worst[key] = min(worst.get(key, c["got"]), round(c["got"], 4))
    return {"recipe": recipe, "ok": True, "why": None, "bytes": dict(report.bytes), "latency": report.latency,
            "measures": worst,
            "excluded": [n for c in report.excluded for n in c["nodes"]]}


def pick(tried: List[dict]) -> Optional[dict]:
    """The fastest candidate that met every threshold and runs faster than float, or None."""
    faster = [t for t in tried if t["ok"] and t["latency"] and t["latency"]["ratio"] is not None
              and t["latency"]["ratio"] < FASTER]
    return min(faster, key=lambda t: t["latency"]["ratio"]) if faster else None


def nothing_pays(target: str, tried: List[dict]) -> QuantizationError:
    """No candidate both met its thresholds and ran faster than float: what each did, nothing written."""
    parts = []
    for t in tried:
        if not t["ok"]:
            parts.append(f"{t['recipe']}: {t['why'].split('; nothing written')[0]}")
        else:
            lat = t["latency"]
            parts.append(f"{t['recipe']}: met its thresholds, {lat['ratio']:.2f}x the float model's time "
                         f"({t['bytes']['ratio']:.2f} of its size)")
    return QuantizationError(f"auto ({target}): no recipe both met its thresholds and ran faster than the float "
                             f"model here (median of {ROUNDS} interleaved runs, 1 thread): " + "; ".join(parts) +
                             "; nothing written (name a recipe to keep a smaller model that is not faster)",
                             recipe=AUTO)
