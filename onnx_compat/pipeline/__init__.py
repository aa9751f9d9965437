"""The export pipeline: ``export()``, read as the sequence of its stages.

request (every argument checked once, ``request.py``; each deployment step
checks its own, ``steps.py``) -> the model run once on the example
(``subject.py``) -> for each capture strategy in turn (``capture.py``):
capture under the patches, repair and fit to the target, dims, cleanup,
verification against the unpatched eager model (``stages.attempt``) -> the
used attempt's findings and metadata, then each step's changes and checks
(``stages.conclude``) -> atomic write, and each step's own files
(``stages.write``) -> the ``Report``, one entry per step. Nothing is written
unless every stage passed, and the model is left as it was.

The pipeline imports none of the deployment features nor the diagnosis:
they are handed in (``onnx_compat/api.py`` builds them from the public
arguments).
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, Optional, Sequence

import torch

from onnx_compat.errors import ExportError, SizedTrace, reraise_interrupt
from onnx_compat.model_state import preserved
from onnx_compat.pipeline import capture, choose, stages
from onnx_compat.pipeline.memory import PeakMemory
from onnx_compat.pipeline.report import Attempt, Report
from onnx_compat.pipeline.request import Diagnose, ExportRequest, build_request
from onnx_compat.pipeline.steps import Step
from onnx_compat.pipeline.weights import folder_for, weight_bytes, works_on_disk

__all__ = ["export", "ExportError", "Report", "Step"]


def export(model: torch.nn.Module, path: str, inputs, outputs, *, steps: Sequence[Step] = (),
           diagnose: Optional[Diagnose] = None, exporter: str = "auto", sizes: Optional[Mapping[str, int]] = None,
           verify: bool = True, atol: float = 1e-4, rtol: float = 1e-3, strict: bool = False,
           metadata: Optional[Mapping[str, str]] = None, opset: Optional[int] = None, seed: int = 0,
           patches: Optional[dict] = None, cleanup: Optional[bool] = None, examples=None,
           target: Optional[str] = None, external_data: Optional[bool] = None,
           progress: Optional[Callable[[str], None]] = None) -> Report:
    """Export ``model`` to ``path`` and prove it, with ``steps`` run around it; return the ``Report``.

    The pipeline alone: what the deployment features add (RASR, contracts, the extra runtimes,
    quantization) comes in as ``steps`` (``steps.Step``), built from the public keyword arguments by
    ``onnx_compat.export`` (``onnx_compat/api.py``, which documents every argument). ``diagnose``: the
    culprit search for a failed attempt (``diagnosis``), handed in from above; None leaves culprits unnamed.
    """
    t_start = time.perf_counter()
    with PeakMemory() as memory:
        memory.stage("request")
        report = _run(model, path, inputs, outputs, progress=memory.telling(progress), exporter=exporter,
                      sizes=sizes, examples=examples, seed=seed, target=target, opset=opset,
                      external_data=external_data, metadata=metadata, verify=verify, atol=atol, rtol=rtol,
                      strict=strict, patches=patches, cleanup=cleanup, steps=steps, diagnose=diagnose)
    report.peak_memory = memory.result().to_dict(weight_bytes(model))
    report.timings["total"] = time.perf_counter() - t_start
    return report


def _run(model: torch.nn.Module, path: str, inputs, outputs, **options) -> Report:
    """The request, each capture strategy until one verifies, the conclusion and the atomic write."""
    request = build_request(model, path, inputs, outputs, **options)
    report = Report(path=request.path, target=str(request.target) if request.target else None)
    # big weights stay in a file during the export even when they end up inside the one .onnx file
    on_disk = request.spill or works_on_disk(weight_bytes(model))
    with folder_for(request.path, on_disk, beside=request.spill) as spill, preserved(model):
        request.tell("checking the model's outputs")
        with preserved(model):  # a forward that caches on the module (a length-keyed table) must not
            request.subject.check_outputs(repeatable=request.verify)  # hand that cache to the trace that follows
        used = _faster(request, report, spill, _first_verified(request, report, spill))
        spill = stages.whole_graph_if_needed(request, used, spill)
        stages.conclude(request, report, used)
        stages.write(request, report, used, spill)
    return report


def _first_verified(request: ExportRequest, report: Report, spill) -> stages.Graph:
    """Each capture strategy in turn until one gives a verified graph; every attempt is on the report. An
    exporter's retry without the patches is skipped when no patch acted in its patched attempt (the same
    export again). When all fail, the error names each exporter's first cause (``first_cause.py``) and the
    module at fault; the search for where wrong numbers start (an export per module: auto on a small loop model
    TorchScript unrolled took 21.4 s with it, 13.8 s without) runs only then, not for an attempt a later one
    makes up for."""
    culprits, errors, failures, deferred = [], {}, [], {}
    strategies = list(request.strategies)  # a TorchScript trace sized by the example comes back after dynamo
    for strategy in strategies:
        if not getattr(strategy, "wanted", lambda attempts, errors: True)(report.attempts, errors):
            continue
        t0, record = time.perf_counter(), Attempt(strategy.name, False, strategy=strategy.label,
                                                  patched=strategy.patches)
        try:
            with preserved(request.model):  # each exporter traces the model as the user gave it
                used = stages.attempt(strategy, request, spill, record)
        except Exception as exc:
            reraise_interrupt(exc)  # Ctrl-C wrapped in another error stops the export; never a failed attempt
            found = stages.failed(exc, record, request, time.perf_counter() - t0, search_modules=False)
            if _put_off(exc, strategy, record, report.attempts, deferred, strategies):
                continue
            _take_place(record, report.attempts, deferred.pop(strategy, None))
            failures.append((found, exc, record))
            errors[id(record)] = exc
            continue
        _take_place(used.attempt, report.attempts, deferred.pop(strategy, None))
        return used
    for found, exc, record in failures:
        found = found or stages.module_culprit(exc, record, request)
        culprits += [found] if found else []
    error, head = stages.no_graph(request, report.attempts, culprits)
    raise error from errors.get(id(head))


def _put_off(exc, strategy, record: Attempt, attempts, deferred: dict, strategies: list) -> bool:
    """auto's TorchScript trace depends on the example's sizes (``sized_trace.py``): the attempt is put off, not
    given up. It stays on the report as it stopped, and comes back in full right after dynamo's patched attempt
    (before the attempts without the patches, as before), taking its place on the report: a model dynamo does
    not verify still gets the graph it got before."""
    if not isinstance(exc.__cause__, SizedTrace) or not getattr(strategy, "sized_first", False):
        return False
    record.stage = stages.PUT_OFF
    attempts.append(record)
    in_full, at = capture.STRATEGIES[0], strategies.index(strategy) + 1
    after = next((k + 1 for k, s in enumerate(strategies[at:], start=at) if s.name == "dynamo" and s.patches),
                 at)  # no dynamo to go first (this model refuses it): in full at once
    deferred[in_full] = record
    strategies.insert(after, in_full)
    return True


def _take_place(record: Attempt, attempts: list, put_off: Optional[Attempt]) -> None:
    """The attempt goes on the report: in the place of the attempt it finishes, if it was put off."""
    if put_off is None:
        attempts.append(record)
    else:
        attempts[next(k for k, a in enumerate(attempts) if a is put_off)] = record


def _faster(request: ExportRequest, report: Report, spill, used: stages.Graph) -> stages.Graph:
    """``auto``: when the verified graph holds ops the latency benchmark found slow in this exporter's form, or
    is half shape bookkeeping or more (``choose.worth_timing``), the other exporter is tried too and the graph that runs faster in ONNX Runtime
    is the one written, with the ratio in the report. Otherwise the first verified graph is kept unmeasured:
    a second export would cost more than the run time it saves (``docs/benchmarks.md``)."""
    reason = choose.worth_timing(used.proto, used.attempt.exporter) if request.exporter == "auto" else None
    tried = {a.exporter for a in report.attempts}
    other = next((s for s in request.strategies if s.name not in tried), None)
    if reason is None or other is None or (spill is not None and spill.beside):
        return used
    t0, record = time.perf_counter(), Attempt(other.name, False)
    try:
        with preserved(request.model):
            second = stages.attempt(other, request, spill, record)
    except Exception as exc:  # the first graph stays; the report says why the other was not used
        reraise_interrupt(exc)
        stages.failed(exc, record, request, time.perf_counter() - t0, search_modules=False)
        report.attempts.append(record)
        return used
    report.attempts.append(second.attempt)
    request.tell("timing both graphs in ONNX Runtime")
    graphs = {g.attempt.exporter: g.proto if spill is None else spill.save_graph(g.proto, f"{g.attempt.exporter}.onnx")
              for g in (used, second)}  # weights kept in a file: each graph loads from its own
    choice = choose.faster(graphs, choose.verification_feeds(request.subject))
    chosen = used if choice.name == used.attempt.exporter else second
    chosen.why = f"{choice.why()} (timed: {reason})"
    report.speed = {"chosen": choice.name, "ratios": dict(choice.ratios), "cost_seconds": choice.cost}
    return chosen

