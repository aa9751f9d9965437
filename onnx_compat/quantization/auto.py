"""``recipe="auto"``: the recipes that suit the target runtime and act on this model, each made and verified,
then timed together against the float model; the fastest that meets every threshold, beats float by more
than the timing noise and makes a smaller file is kept; one slower than float, or larger, never is.

Why: no recipe is faster everywhere. On a 1.8 M-parameter Transformer at one
thread int8-static ran 1.11x and fp16 1.13x the float model's time while
int8-dynamic ran 0.75x; which one pays depends on the model, the runtime and
the machine, so it is measured, not assumed. All candidates that met their
thresholds and the float model run in one interleaved loop (``latency``), so
the machine's load hits every one alike and their ratios compare. When none
is faster than float, nothing is written and the error lists what each did:
a smaller file that is slower is a choice the user makes by naming a recipe.

Why only recipes that act on the model, and a margin: on one ``Linear(8, 6)``
the three dynamic recipes made the same model (it has no Conv, and nothing
else the dynamic quantizer handles), timed 0.93x, 0.75x and 0.74x the float
model's time in one loop; the last (int8-dynamic-all; int8-dynamic-conv in
another run) was written at 1.73 of the float file's size. A recipe whose nodes
are all another's (same maker, same options, the same nodes of this graph) is
not a candidate, nor one that quantizes no node, nor one whose model made has
an earlier candidate's graph (``api._make_auto``); a lead smaller than
``MARGIN`` of the float time (or the float runs' own spread, when larger) is no
lead: among candidates that close, the smaller file, then the earlier recipe,
is kept; a file no smaller than the float one is never kept (int8 scales and
quantize nodes outweigh the weights of a tiny model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .errors import QuantizationError

AUTO = "auto"
ROUNDS = 15  # interleaved runs of each candidate and the float model (more than one recipe's 7: ratios are compared)
FASTER = 1.0  # a candidate is kept only below this ratio of the float model's time, less the margin
MARGIN = 0.05  # a lead in time smaller than this share of the float time is timing noise (latency.SLOWER's 5 %)

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
    if report is None:  # error: a QuantizationError, or why the recipe is not a candidate (``candidates``)
        return {"recipe": recipe, "ok": False, "why": str(error), "bytes": None, "latency": None, "measures": {}}
    worst: dict = {}  # output/measure -> the lower of its values against the float model and against eager
    for c in report.verification.get("checks", []):
        key = f"{c['output']}/{c['measure']}"
        worst[key] = min(worst.get(key, c["got"]), round(c["got"], 4))
    return {"recipe": recipe, "ok": True, "why": None, "bytes": dict(report.bytes), "latency": report.latency,
            "measures": worst,
            "excluded": [n for c in report.excluded for n in c["nodes"]]}


def candidates(plan: Plan, graph) -> Tuple[List[str], Dict[str, str]]:
    """The recipes of ``plan`` worth making for this float ``graph``: ``(names, {left out: why})``. Left out:
    a recipe that quantizes no node of the graph, and one that would make the model an earlier candidate
    makes (same maker and options, the same nodes: ``int8-dynamic-conv`` on a model without Conv)."""
    from . import recipes
    kept: Dict[tuple, str] = {}
    names, left = [], {}
    for name in plan.candidates:
        recipe = recipes.by_name(name)
        nodes = recipes.acts_on(recipe, graph)
        key = (recipes.maker(recipe), frozenset(nodes))
        if not nodes:
            left[name] = (f"not a candidate: quantizes no node of this model (it handles "
                          f"{', '.join(recipes.handled(recipe)) or 'no op'}; the model has none of them)")
        elif key in kept:
            ops = sorted({n.op_type for n in graph.node if n.name in nodes})
            left[name] = (f"not a candidate: makes the model {kept[key]} makes here (the same {len(nodes)} "
                          f"node(s): {', '.join(ops)})")
        else:
            kept[key] = name
            names.append(name)
    return names, left


def margin(lat: dict) -> float:
    """The smallest lead in time (a share of the float time) that is not noise: ``MARGIN``, or the float runs'
    own interquartile spread over their median when the machine is noisier than that."""
    return max(MARGIN, float(lat.get("spread") or 0.0))


def pick(tried: List[dict]) -> Optional[dict]:
    """The candidate to keep, or None: met every threshold, a smaller file than float, faster than float by
    more than the margin; the fastest, and among those within the margin of it, the smallest file, then the
    first in the plan's order."""
    order = {t["recipe"]: k for k, t in enumerate(tried)}
    faster = [t for t in tried if _why_not(t) is None]
    if not faster:
        return None
    best = min(faster, key=lambda t: t["latency"]["ratio"])
    close = [t for t in faster if t["latency"]["ratio"] - best["latency"]["ratio"] <= margin(best["latency"])]
    return min(close, key=lambda t: (t["bytes"]["ratio"], order[t["recipe"]]))


def chosen_by(target: str, best: dict, tried: List[dict]) -> str:
    """Why ``best`` was kept, for the report: its time and size against float, and what it was chosen among."""
    lat, space = best["latency"], margin(best["latency"])
    faster = [t for t in tried if _why_not(t) is None]
    fastest = min(t["latency"]["ratio"] for t in faster)
    close = [t["recipe"] for t in faster if t is not best and t["latency"]["ratio"] - fastest <= space]
    among = (f"the smallest file of those within the {space:.0%} timing margin of the fastest ({', '.join(close)} "
             "too)" if close else f"the fastest, by more than the {space:.0%} timing margin")
    acting = sum(1 for t in tried if not t["why"] or not t["why"].startswith("not a candidate"))
    return (f"auto ({target}): {lat['ratio']:.2f}x the float model's time, {best['bytes']['ratio']:.2f} of its size; "
            f"{among}; {len(faster)} of {acting} candidate(s) acting on this model met every threshold, were "
            f"faster and smaller ({len(tried)} recipe(s) for the target)")


def _why_not(t: dict) -> Optional[str]:
    """Why a candidate cannot be kept (None: it can)."""
    if not t["ok"]:
        return t["why"].split("; nothing written")[0]
    lat, size = t["latency"], t["bytes"]
    ran = f"met its thresholds, {lat['ratio']:.2f}x the float model's time ({size['ratio']:.2f} of its size)"
    if size["ratio"] >= 1:
        return f"{ran}: a file no smaller than the float one"
    if lat["ratio"] is None or lat["ratio"] > FASTER - margin(lat):
        if margin(lat) > MARGIN:
            return (f"{ran}: not faster by more than the timing noise here (the float model's own runs spread "
                    f"{margin(lat):.0%} of their median: a timing margin this machine's load sets)")
        return f"{ran}: not faster by more than the {MARGIN:.0%} timing margin"
    return None


def nothing_pays(target: str, tried: List[dict]) -> QuantizationError:
    """No candidate met its thresholds, ran faster than float by the margin and made a smaller file: what
    each did, nothing written."""
    parts = [f"{t['recipe']}: {_why_not(t)}" for t in tried]
    return QuantizationError(f"auto ({target}): no recipe met its thresholds, ran faster than the float model "
                             f"by more than the timing margin and made a smaller file here (median of {ROUNDS} "
                             "interleaved runs, 1 thread): " + "; ".join(parts) +
                             "; nothing written (name a recipe to keep a model that is not faster or not smaller)",
                             recipe=AUTO)
