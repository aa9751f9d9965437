"""``quantize``: a smaller model of a proven float export, verified with measures that fit it, or nothing.

Order of work: every argument is checked (recipe, the float model's
verification report, measures and thresholds, calibration examples) before
anything runs; the float model is copied into a temporary folder and never
written to; the approximate model is made, verified against the float ONNX
model and the unpatched eager model, nodes are excluded while it misses a
threshold, and only a model that meets every threshold is written (to a
temporary file beside ``out``, then renamed).

``recipe="auto"`` (the default, and what a user who names only a ``target``
gets) tries the recipes that suit the target runtime and act on the model, and
keeps the fastest that meets every threshold, runs faster than float by more
than the timing noise and makes a smaller file (``auto.py``).

The file written records its recipe, the float model's content hash and the
measures it met in its ``metadata_props`` (``recorded.py``): ``verify`` names
it as quantized when it misses ``atol``, and ``verify_quantized`` re-runs those
measures against the eager model.

Where the models go: ``quantize(...)`` writes ``out`` (default
``<stem>.<recipe>.onnx`` beside the float model, which stays as it is);
``export(..., quantize=recipe)`` writes the approximate model at ``path`` and
keeps the float one beside it as ``<stem>.float.onnx`` (``finish_export``).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from typing import Dict, List, Optional, Sequence

import onnx
import torch

from ..spec import TensorSpec
from . import auto, exclusion, latency, logs, measures as measures_mod, recipes, recorded, verify_approx
from ..pipeline.files import check_writable, content_hash, write_atomically
from ..pipeline.report import Report
from .calibration import FeedsReader, calibration_feeds
from .errors import QuantizationError, QuantizationWarning
from .report import QuantReport

EXCLUDE_LIMIT = 16  # nodes automatic exclusion may leave in float before it says none helps
RANKING_FEEDS = 2  # calibration inputs the per-node error is measured on


def quantize(onnx_path, model: torch.nn.Module, inputs, outputs, *, recipe: str = auto.AUTO,
             target: Optional[str] = None, out: Optional[str] = None, measures=None,
             thresholds: Optional[Dict[str, float]] = None, examples=None, report=None,
             exclude_limit: int = EXCLUDE_LIMIT) -> QuantReport:
    """Make ``recipe``'s version of the proven float model at ``onnx_path``, verify it, write it to ``out``.

    ``recipe``: a name from ``RECIPES``, or ``"auto"`` (default): the recipes that suit ``target`` (default
    ``"onnxruntime"``, CPU) are each made and verified, then timed against the float model in one interleaved
    loop; the fastest that met every threshold and runs faster than float is written (``out`` default
    ``<stem>.<that recipe>.onnx``), and the report's ``tried`` holds each one's size, latency and measures.

    ``report``: the float model's verification report (a ``Report`` or its JSON path); required: an
    unproven float model has no reference worth approximating. ``measures``: names for every float output
    (default ``("snr", "cosine")``), or ``{output: [names]}``; task measures ``top1`` and ``ctc`` are
    chosen here. ``thresholds``: ``{measure: value}`` or ``{"output/measure": value}`` (lower bounds).
    ``examples``: real inputs ``[{onnx_name: tensor}]`` to calibrate static recipes on (default: generated
    inputs, said in the report). ``exclude_limit``: most nodes automatic exclusion may keep in float.
    Raises ``QuantizationError`` (nothing written) on bad input or a threshold missed.
    """
    t0 = time.perf_counter()
    onnx_path = os.path.abspath(os.fspath(onnx_path))
    job = check_request(recipe, inputs, outputs, target=target, measures=measures, thresholds=thresholds,
                        examples=examples, graph=_graph(onnx_path))
    proven = _proven(report, onnx_path, job["recipe"].name)
    names = getattr(job["recipe"], "candidates", None) or (job["recipe"].name,)
    paths = {name: _out_path(out, onnx_path, name) for name in names}  # every possible path checked before work
    job["float_sha256"] = content_hash(onnx_path)
    with tempfile.TemporaryDirectory(prefix="onnx_compat_quantize_") as work:
        float_copy = _working_copy(onnx.load(onnx_path), work, job["recipe"].name)
        made, result = _make_verified(float_copy, work, model, job, exclude_limit)
        result.float_path, result.float_report = onnx_path, proven
        out = paths[result.recipe]
        write_atomically(onnx.load(made), out)
    result.path = out
    result.timings["total"] = time.perf_counter() - t0
    return result


def finish_export(proto: onnx.ModelProto, path: str, model: torch.nn.Module, inputs, outputs, report, *,
                  recipe=auto.AUTO, target: Optional[str] = None, measures=None, thresholds=None, examples=None,
                  exclude_limit: int = EXCLUDE_LIMIT) -> QuantReport:
    """The end of ``export(..., quantize=recipe)``, called instead of writing the verified float ``proto``:
    the approximate model goes to ``path`` and the float model beside it as ``<stem>.float.onnx``; when
    quantization fails neither is written. ``report``: the export's ``Report`` (verified)."""
    t0 = time.perf_counter()
    path = check_writable(path)
    job = check_request(recipe, inputs, outputs, target=target, measures=measures, thresholds=thresholds,
                        examples=examples, graph=proto.graph)
    _proven(report, None, job["recipe"].name)
    float_path = float_path_for(path)
    job["float_sha256"] = "sha256:" + hashlib.sha256(proto.SerializeToString()).hexdigest()  # as onnx.save writes it
    with tempfile.TemporaryDirectory(prefix="onnx_compat_quantize_") as work:
        float_copy = _working_copy(proto, work, job["recipe"].name)
        made, result = _make_verified(float_copy, work, model, job, exclude_limit)
        # the float model is written once the quantized one is complete, just before it is renamed into place
        write_atomically(onnx.load(made), path, before_rename=lambda: write_atomically(proto, float_path))
    result.path, result.float_path, result.float_report = path, float_path, "in memory (the export's report)"
    result.timings["total"] = time.perf_counter() - t0
    return result


def float_path_for(path: str) -> str:
    """Where ``export(..., quantize=...)`` keeps the float model: ``model.onnx`` -> ``model.float.onnx``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.float{ext or '.onnx'}"


def check_request(recipe=auto.AUTO, inputs=None, outputs=None, *, target=None, measures=None, thresholds=None,
                  examples=None, graph=None) -> dict:
    """Every argument checked before anything runs (``export`` calls it before exporting): the recipe (or
    ``auto``'s plan for ``target``), measures and thresholds, and the calibration examples. Returns what
    ``_make_verified`` needs. ``graph``: the float model's graph when known (a (Log)Softmax output gets top1
    among the default measures)."""
    if recipe is None or recipe == auto.AUTO:
        chosen = auto.plan(target)
    else:
        chosen = recipes.by_name(recipe)
        if target is not None:
            auto.plan(target)  # a target auto does not know is named even when a recipe is given
    inputs, outputs = _specs(inputs, "inputs", chosen.name), _specs(outputs, "outputs", chosen.name)
    floats = [s.name for s in outputs if s.dtype.is_floating_point]
    resolved = measures_mod.resolve(measures, thresholds, floats, chosen.name,
                                    class_outputs=measures_mod.class_outputs(outputs, graph))
    for name, items in resolved.items():
        spec = next(s for s in outputs if s.name == name)
        for m in items:
            ranks = (2, 3) if m.name == "top1" else (3,)
            if m.task and (len(spec.dims) not in ranks or tuple(spec.lengths) not in ((), (1,))):
                reads = "[B, T, classes] or [B, classes]" if m.name == "top1" else "[B, T, classes]"
                raise QuantizationError(f"measure {m.name} reads {reads} scores; output {name!r} has "
                                        f"{len(spec.dims)} dims", recipe=chosen.name, measure=m.name, output=name)
    feeds, described = calibration_feeds(inputs, examples, chosen.name)
    return {"recipe": chosen, "inputs": inputs, "outputs": outputs, "measures": resolved, "feeds": feeds,
            "calibration": described}


def _graph(onnx_path: str):
    """The float model's graph without its weights, or None when it does not load (``_proven`` says why)."""
    try:
        return onnx.load(onnx_path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - a file that does not load is reported where it is matched to its report
        return None


def _specs(specs, what: str, recipe: str) -> List[TensorSpec]:
    specs = [specs] if isinstance(specs, TensorSpec) else list(specs or ())
    if not specs or not all(isinstance(s, TensorSpec) for s in specs):
        raise QuantizationError(f"{what} must be a TensorSpec or a non-empty list of TensorSpec", recipe=recipe)
    return specs


def _proven(report, onnx_path: Optional[str], recipe: str) -> str:
    """The float model's verification report must exist, say every check passed and describe this model."""
    if report is None:
        raise QuantizationError("quantize needs the float model's verification report (report=: the Report "
                                "export returned, or its JSON): an unproven float model is no reference",
                                recipe=recipe)
    where = os.fspath(report) if isinstance(report, (str, os.PathLike)) else "in memory"
    data = _report_dict(report, recipe)
    checks = data.get("verification") or []
    if not checks:
        raise QuantizationError(f"the float model's report ({where}) holds no verification (exported with "
                                "verify=False?): verify it first", recipe=recipe)
    failed = [c.get("sizes") for c in checks if not c.get("ok")]
    if failed:
        raise QuantizationError(f"the float model's report ({where}) says verification failed at {failed}",
                                recipe=recipe)
    if onnx_path is not None:
        _same_model(data, onnx_path, where, recipe)
    return where


def _report_dict(report, recipe: str) -> dict:
    if isinstance(report, Report):
        return report.to_dict()
    if isinstance(report, dict):
        return report
    try:
        with open(os.fspath(report), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError, TypeError) as exc:
        raise QuantizationError(f"cannot read the float model's report {report!r}: {exc}", recipe=recipe) from exc


def _same_model(data: dict, onnx_path: str, where: str, recipe: str) -> None:
    """The report must describe the file at ``onnx_path``: its content hash as export recorded it (a graph
    of the same architecture with other weights has the same I/O and nodes, and is another model)."""
    recorded = data.get("model_sha256")
    if not recorded:
        raise QuantizationError(f"the report ({where}) records no content hash of the model it proved (written "
                                "by an older onnx_compat, or not by export): it cannot be matched to "
                                f"{onnx_path}; export the model again and pass that report", recipe=recipe)
    found = content_hash(onnx_path)
    if found != recorded:
        raise QuantizationError(f"the report ({where}) describes another model: it proved a file with content "
                                f"{recorded[:19]}..., {onnx_path} has {found[:19]}... (another model, other "
                                "weights, or the file changed since its export)", recipe=recipe)


def _out_path(out: Optional[str], onnx_path: str, recipe: str) -> str:
    if out is None:
        stem, ext = os.path.splitext(onnx_path)
        out = f"{stem}.{recipe}{ext or '.onnx'}"
    try:
        out = check_writable(out)
    except ValueError as exc:
        raise QuantizationError(str(exc), recipe=recipe) from exc
    if os.path.exists(out) and os.path.samefile(out, onnx_path):
        raise QuantizationError(f"out={out!r} is the float model itself; it is left untouched: choose another path",
                                recipe=recipe)
    return out


def _working_copy(proto: onnx.ModelProto, work: str, recipe: str) -> str:
    """The float model in ``work``, every node named (exclusion names nodes), weights inline."""
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        raise QuantizationError("the float model keeps its weights in an external data file, which the quantizers "
                                "here are not run on: quantize a model under 2 GB written without external_data",
                                recipe=recipe)
    copy = onnx.ModelProto.FromString(proto.SerializeToString())
    taken = {n.name for n in copy.graph.node}
    for k, node in enumerate(copy.graph.node):
        if not node.name:
            node.name = next(f"{node.op_type}_{k}_{i}" for i in range(len(taken) + 1)
                             if f"{node.op_type}_{k}_{i}" not in taken)
            taken.add(node.name)
    path = os.path.join(work, "float.onnx")
    onnx.save(copy, path)
    return path


def _make_verified(float_path: str, work: str, model, job: dict, limit: int):
    """The eager and float references (computed once, whatever is tried), then the recipe made, verified and
    timed against float, or ``auto``'s candidates: ``(path of the model made, QuantReport)``."""
    timings: Dict[str, float] = {}
    t = time.perf_counter()
    counted = [o for o, ms in job["measures"].items() if any(m.task for m in ms)]  # frames matter to these
    cases = verify_approx.cases_for(model, job["inputs"], job["outputs"], counted=counted)
    references = verify_approx.reference_outputs(float_path, cases)
    _reachable(float_path, cases, references, job["outputs"], job["measures"], job["recipe"].name)
    timings["references"] = time.perf_counter() - t
    if isinstance(job["recipe"], auto.Plan):
        return _make_auto(float_path, work, job, cases, references, limit, timings)
    made, report = _make_one(float_path, work, job["recipe"], job, cases, references, limit, timings)
    t = time.perf_counter()
    runs = _timed_runs(float_path, {"quantized": made}, cases)
    report.latency = {**latency.compare(runs["float"], runs["quantized"]), "sizes": dict(_timing_case(cases).sizes)}
    timings["latency"] = time.perf_counter() - t
    _share_and_warnings(report, made)
    return made, report


def _make_auto(float_path: str, work: str, job: dict, cases, references, limit: int, timings: Dict[str, float]):
    """Each candidate of ``auto``'s plan that acts on this model made and verified; those that met every
    threshold timed together against float; ``auto.pick``'s choice kept, every recipe a row of ``tried``."""
    plan, made, reports = job["recipe"], {}, {}
    names, dropped = auto.candidates(plan, onnx.load(float_path, load_external_data=False).graph)
    graphs: Dict[str, str] = {}  # the graph each candidate made -> that candidate
    for name in names:
        t = time.perf_counter()
        try:
            made[name], reports[name] = _make_one(float_path, work, recipes.by_name(name), job, cases, references,
                                                  limit, {})
        except QuantizationError as exc:  # missed a threshold or changed nothing: a row of the report, not the end
            dropped[name] = exc
        else:  # the same graph as an earlier candidate's (ops a quantizer lists but left alone): not timed again
            same = graphs.setdefault(_graph_digest(made[name]), name)
            if same != name:
                del made[name], reports[name]
                dropped[name] = f"not a candidate: made the graph {same} made (it left the rest of its ops alone)"
        timings[f"make_and_verify {name}"] = time.perf_counter() - t
    t = time.perf_counter()
    if made:
        runs = _timed_runs(float_path, made, cases)
        speeds = latency.compare_many(runs.pop("float"), runs, rounds=auto.ROUNDS)
        for name, report in reports.items():
            report.latency = {**speeds[name], "sizes": dict(_timing_case(cases).sizes)}
    timings["latency"] = time.perf_counter() - t
    tried = [auto.tried_entry(n, reports.get(n), dropped.get(n)) for n in plan.candidates]
    best = auto.pick(tried)
    if best is None:
        raise auto.nothing_pays(plan.target, tried)
    report = reports[best["recipe"]]
    report.target, report.tried, report.timings = plan.target, tried, timings
    report.chosen_by = auto.chosen_by(plan.target, best, tried)
    _share_and_warnings(report, made[best["recipe"]], stacklevel=5)
    return made[best["recipe"]], report


def _graph_digest(path: str) -> str:
    """The graph of the model at ``path`` (nodes and weights, not the metadata naming its recipe), hashed."""
    return hashlib.sha256(onnx.load(path).graph.SerializeToString()).hexdigest()


def _make_one(float_path: str, work: str, recipe, job: dict, cases, references, limit: int,
              timings: Dict[str, float]):
    """One recipe made, verified, nodes excluded while it misses a threshold: ``(path, QuantReport)`` without
    its latency; a ``QuantizationError`` when it misses or changes nothing."""
    outputs, chosen = job["outputs"], job["measures"]
    made = os.path.join(work, f"{recipe.name}.onnx")
    reader = FeedsReader(job["feeds"]) if recipe.calibrated else None

    messages: List[str] = []

    def make(exclude: Sequence[str]) -> None:
        with logs.captured(messages):  # ONNX Runtime's advice to pre-process, on every call: see logs.py
            recipe.make(float_path, made, exclude=exclude, calibration=None if reader is None else reader.rewind())
        recorded.stamp(made, recorded.record(recipe.name, job.get("float_sha256", ""), chosen))

    def check():
        return verify_approx.measure(verify_approx.runner(made), cases, references, outputs, chosen)

    t = time.perf_counter()
    make(())
    first_size = os.path.getsize(made)
    first = check()
    timings["make_and_verify"] = time.perf_counter() - t
    t = time.perf_counter()
    result, excluded = first, []
    if not first.ok:
        result, excluded = exclusion.exclude_until_met(make, check, first, float_path, made,
                                                       job["feeds"][:RANKING_FEEDS], recipe.op_types, work, limit)
        timings["exclusion"] = time.perf_counter() - t
    if not result.ok:
        raise _missed(recipe.name, first, result, excluded)
    if result.identical:
        raise _unchanged(recipe.name, excluded)
    calibrated = job["calibration"] if recipe.calibrated else None
    report = QuantReport(recipe.name, getattr(recipe, "about", ""), calibration=calibrated,
                         measures={o: [f"{m.name} >= {m.threshold:g}" for m in ms] for o, ms in chosen.items()},
                         verification=result.to_dict(), excluded=[c.to_dict() for c in excluded], timings=timings,
                         messages=messages)
    size, float_size = os.path.getsize(made), os.path.getsize(float_path)
    report.bytes = {"float": float_size, "quantized": size, "ratio": round(size / float_size, 4),
                    "larger": size >= float_size}  # a larger file is warned of (named recipe) or not kept (auto)
    if excluded:
        report.exclusion_cost = _cost(first, result, first_size, size)
    return made, report


def _timing_case(cases):
    """The largest checked input: where a difference in speed shows most."""
    return max(cases, key=lambda c: sum(v.numel() for v in c.feeds.values()))


def _timed_runs(float_path: str, made: Dict[str, str], cases) -> dict:
    """One call each of the float model and every model made, on the largest checked input, one thread."""
    feeds = {k: v.numpy() for k, v in _timing_case(cases).feeds.items()}
    runners = {"float": verify_approx.runner(float_path), **{n: verify_approx.runner(p) for n, p in made.items()}}
    return {name: (lambda run=run: run(feeds)) for name, run in runners.items()}


def _share_and_warnings(report: QuantReport, made: str, stacklevel: int = 4) -> None:
    """The share of weights left in float32, and what a user should know before deploying the model written
    (slower than float, most weights float32), warned about and kept in the report."""
    excluded = [n for c in report.excluded for n in c["nodes"]]
    report.float_weights = latency.float_weight_share(onnx.load(made))
    report.warnings = latency.warnings_for(report.recipe, report.latency, report.float_weights, excluded,
                                           report.bytes)
    for text in report.warnings:
        warnings.warn(text, QuantizationWarning, stacklevel=stacklevel)


def _reachable(float_path, cases, references, outputs, chosen, recipe: str) -> None:
    """A threshold the float model itself misses against eager cannot be met by an approximation of it."""
    float_result = verify_approx.measure(verify_approx.runner(float_path), cases, references, outputs, chosen)
    for c in float_result.missed():
        raise QuantizationError(f"threshold {c.measure} >= {c.threshold:g} on {c.output!r} cannot be met: the float "
                                f"model itself scores {c.got:.4g} against {c.against} at sizes {c.at}",
                                recipe=recipe, measure=c.measure, got=c.got, threshold=c.threshold, output=c.output)


def _missed(recipe: str, first, result, excluded) -> QuantizationError:
    worst = result.missed()[0]
    short = "" if worst.threshold is None else f" (short by {worst.threshold - worst.got:.4g})"
    bound = "exact" if worst.threshold is None else f"threshold {worst.threshold:g}"
    names = [n for c in excluded for n in c.nodes]
    tried = (f"; excluding the {len(names)} worst node(s) {names} did not help enough "
             f"(before exclusion: {first.missed()[0].got:.4g})" if excluded else
             "; no node adds error that exclusion could remove: none helps")
    return QuantizationError(f"{recipe}: output {worst.output!r} {worst.measure} against {worst.against} is "
                             f"{worst.got:.4g}, {bound}{short}, at sizes {worst.at}{tried}; nothing written",
                             recipe=recipe, measure=worst.measure, got=worst.got, threshold=worst.threshold,
                             output=worst.output, excluded=names)


def _unchanged(recipe: str, excluded) -> QuantizationError:
    """A model whose outputs are the float model's to the bit approximates nothing: not worth a file."""
    names = [n for c in excluded for n in c.nodes]
    why = (f"excluding {names} left nothing quantized that matters: none helps" if names else
           "the recipe changes nothing in this model (none of its ops is one the recipe quantizes)")
    return QuantizationError(f"{recipe}: the model made gives the float model's outputs exactly at every checked "
                             f"shape; {why}; nothing written", recipe=recipe, excluded=names)


def _cost(first, result, first_size: int, size: int) -> dict:
    before = {f"{c.output}/{c.measure}/{c.against}": round(c.got, 4) for c in first.checks}
    after = {f"{c.output}/{c.measure}/{c.against}": round(c.got, 4) for c in result.checks}
    return {"bytes_added": size - first_size, "bytes_before_exclusion": first_size,
            "missed_before": [k for k, c in zip(before, first.checks) if not c.ok],
            "before": before, "after": after}
