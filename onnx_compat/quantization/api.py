"""``quantize``: a smaller model of a proven float export, verified with measures that fit it, or nothing.

Order of work: every argument is checked (recipe, the float model's
verification report, measures and thresholds, calibration examples) before
anything runs; the float model is copied into a temporary folder and never
written to; the approximate model is made, verified against the float ONNX
model and the unpatched eager model, nodes are excluded while it misses a
threshold, and only a model that meets every threshold is written (to a
temporary file beside ``out``, then renamed).

Where the models go: ``quantize(...)`` writes ``out`` (default
``<stem>.<recipe>.onnx`` beside the float model, which stays as it is);
``export(..., quantize=recipe)`` writes the approximate model at ``path`` and
keeps the float one beside it as ``<stem>.float.onnx`` (``finish_export``).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from typing import Dict, List, Optional, Sequence

import onnx
import torch

from ..spec import TensorSpec
from . import exclusion, latency, logs, measures as measures_mod, recipes, verify_approx
from ..pipeline.files import check_writable, content_hash, write_atomically
from ..pipeline.report import Report
from .calibration import FeedsReader, calibration_feeds
from .errors import QuantizationError, QuantizationWarning
from .report import QuantReport

EXCLUDE_LIMIT = 16  # nodes automatic exclusion may leave in float before it says none helps
RANKING_FEEDS = 2  # calibration inputs the per-node error is measured on


def quantize(onnx_path, model: torch.nn.Module, inputs, outputs, *, recipe, out: Optional[str] = None,
             measures=None, thresholds: Optional[Dict[str, float]] = None, examples=None, report=None,
             exclude_limit: int = EXCLUDE_LIMIT) -> QuantReport:
    """Make ``recipe``'s version of the proven float model at ``onnx_path``, verify it, write it to ``out``.

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
    job = check_request(recipe, inputs, outputs, measures=measures, thresholds=thresholds, examples=examples,
                        graph=_graph(onnx_path))
    proven = _proven(report, onnx_path, job["recipe"].name)
    out = _out_path(out, onnx_path, job["recipe"].name)
    with tempfile.TemporaryDirectory(prefix="onnx_compat_quantize_") as work:
        float_copy = _working_copy(onnx.load(onnx_path), work, job["recipe"].name)
        made, result = _make_verified(float_copy, work, model, job, exclude_limit)
        result.float_path, result.float_report = onnx_path, proven
        write_atomically(onnx.load(made), out)
    result.path = out
    result.timings["total"] = time.perf_counter() - t0
    return result


def finish_export(proto: onnx.ModelProto, path: str, model: torch.nn.Module, inputs, outputs, report, *,
                  recipe, measures=None, thresholds=None, examples=None,
                  exclude_limit: int = EXCLUDE_LIMIT) -> QuantReport:
    """The end of ``export(..., quantize=recipe)``, called instead of writing the verified float ``proto``:
    the approximate model goes to ``path`` and the float model beside it as ``<stem>.float.onnx``; when
    quantization fails neither is written. ``report``: the export's ``Report`` (verified)."""
    t0 = time.perf_counter()
    path = check_writable(path)
    job = check_request(recipe, inputs, outputs, measures=measures, thresholds=thresholds, examples=examples,
                        graph=proto.graph)
    _proven(report, None, job["recipe"].name)
    float_path = float_path_for(path)
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


def check_request(recipe, inputs, outputs, *, measures=None, thresholds=None, examples=None, graph=None) -> dict:
    """Every argument checked before anything runs (``export`` calls it before exporting): the recipe,
    measures and thresholds, and the calibration examples. Returns what ``_make_verified`` needs.
    ``graph``: the float model's graph when known (a (Log)Softmax output gets top1 among the default measures)."""
    chosen = recipes.by_name(recipe)
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
    """Make, verify, exclude while a threshold is missed: ``(path of the model made, QuantReport)``."""
    recipe, outputs, chosen = job["recipe"], job["outputs"], job["measures"]
    timings: Dict[str, float] = {}
    t = time.perf_counter()
    cases = verify_approx.cases_for(model, job["inputs"], outputs)
    references = verify_approx.reference_outputs(float_path, cases)
    _reachable(float_path, cases, references, outputs, chosen, recipe.name)
    timings["references"] = time.perf_counter() - t
    made = os.path.join(work, f"{recipe.name}.onnx")
    reader = FeedsReader(job["feeds"]) if recipe.calibrated else None

    messages: List[str] = []

    def make(exclude: Sequence[str]) -> None:
        with logs.captured(messages):  # ONNX Runtime's advice to pre-process, on every call: see logs.py
            recipe.make(float_path, made, exclude=exclude, calibration=None if reader is None else reader.rewind())

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
    report.bytes = {"float": float_size, "quantized": size, "ratio": round(size / float_size, 4)}
    if excluded:
        report.exclusion_cost = _cost(first, result, first_size, size)
    t = time.perf_counter()
    _speed_and_share(report, float_path, made, cases, [n for c in excluded for n in c.nodes])
    timings["latency"] = time.perf_counter() - t
    return made, report


def _speed_and_share(report: QuantReport, float_path: str, made: str, cases, excluded: List[str]) -> None:
    """The latency against the float model (interleaved runs on the largest checked input) and the share of
    weights left in float32; what a user should know before deploying it is warned about and kept."""
    case = max(cases, key=lambda c: sum(v.numel() for v in c.feeds.values()))
    feeds = {k: v.numpy() for k, v in case.feeds.items()}
    float_run, made_run = verify_approx.runner(float_path), verify_approx.runner(made)
    report.latency = latency.compare(lambda: float_run(feeds), lambda: made_run(feeds))
    report.latency["sizes"] = dict(case.sizes)
    report.float_weights = latency.float_weight_share(onnx.load(made))
    report.warnings = latency.warnings_for(report.recipe, report.latency, report.float_weights, excluded)
    for text in report.warnings:
        warnings.warn(text, QuantizationWarning, stacklevel=4)


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
