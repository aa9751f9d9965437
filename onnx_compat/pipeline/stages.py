"""The stages of ``export()`` after the request: one exporter's attempt, and the conclusion.

An attempt is capture -> repair and fit -> opset and dims checks -> cleanup
-> verification, with everything it learns (warnings, repairs, node counts,
timings, the culprit of a failure) kept on its own ``Attempt``; only the
attempt that is used hands its state to the report. The conclusion writes
metadata and runs the deployment steps' checks (``steps.py``), summarises the
graph; the file is written atomically (or by the step that writes the model).
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import onnx
import torch

from onnx_compat import graph
from onnx_compat._version import __version__
from onnx_compat.errors import CaptureError, Culprit, DimSpecialized, ExportError, VerificationError
from onnx_compat.pipeline import capture, dims, draw_inputs, first_cause, releases, size_remainders
from onnx_compat.pipeline.files import write_atomically
from onnx_compat.int_repair import repair_int_types, repaired_while_exporting
from onnx_compat.model_state import preserved
from onnx_compat.pipeline.capture_said import baked_hint, counted_hint, froze_a_value
from onnx_compat.pipeline.openvino_fixes import fix_for_openvino
from onnx_compat.pipeline.report import Attempt, Report
from onnx_compat.pipeline.request import ExportRequest
from onnx_compat.pipeline.steps import model_writer
from onnx_compat.pipeline.verification import reference_cases, verify as verify_model
from onnx_compat.spec import TensorSpec, with_far_sizes


PUT_OFF = "put off"  # an attempt's stage: its trace depends on the example's sizes, and dynamo went first


@dataclass
class Graph:
    """A verified (or, with ``verify=False``, unverified) graph and its verification results."""

    proto: onnx.ModelProto
    results: Optional[list]
    attempt: Attempt
    why: Optional[str] = None  # why this graph was chosen, when both exporters' graphs were timed


def attempt(strategy, request: ExportRequest, spill, record: Attempt) -> Graph:
    """One exporter, start to verified graph; what it learns goes on ``record`` as it goes, so a
    failure half-way still reports the warnings and repairs seen before it."""
    t0 = time.perf_counter()
    subject = request.subject
    asked = releases.opset_for(strategy.name, request.opset, request.target)
    request.tell(f"capture ({strategy.label})")
    record.strategy, record.patched = strategy.label, strategy.patches
    with preserved(subject.model):  # verification's eager runs start from the model as it was, not as the trace
        # left it (a forward that keeps what it computed on the module: AudioSeal's random message)
        proto, captured = capture.run(strategy, subject.adapter(), subject.args, subject.inputs, subject.outputs,
                                      asked, request.patches, weights=spill)
    t_captured = time.perf_counter()
    record.capture, record.warnings = captured.capture, {"baked": captured.baked, "other": captured.other}
    record.acted, record.assumed, record.counted = list(captured.acted), list(captured.assumed), list(captured.counted)
    _check_opset(proto, asked, strategy.name)
    proto, record.repairs = repair_int_types(proto)
    record.repairs[:0] = repaired_while_exporting(proto)  # patched() casts a TorchScript graph's sizes itself
    record.openvino, kept = fix_for_openvino(proto)  # ONNX Runtime's outputs unchanged; OpenVINO's right
    record.openvino += [f"left as it was: {k}" for k in kept]
    record.repairs += [c for c in [releases.fit(proto, request.target)] if c]
    if request.strict and captured.baked:
        raise ExportError(f"strict: a tensor was turned into a Python number while tracing: {captured.baked[0]}",
                          stage="strict")
    check_dims(proto, subject.specs, "")
    t1 = time.perf_counter()
    record.timings[f"export_{strategy.name}"] = t_captured - t0
    record.timings["repair"] = t1 - t_captured  # int repair, OpenVINO fixes, fitting, the dims check
    # the exporter's own bytes go to ONNX Runtime unless repair or fit changed the graph
    serialized = None if record.repairs or record.openvino else captured.serialized
    # one more shape at a multiple of each divisor of a size's remainder, in the trace or the graph
    sizes = size_remainders.shapes(subject.inputs, subject.example,
                                   captured.remainders + size_remainders.divisors_in_graph(proto))
    if froze_a_value(captured.baked):  # such a graph can hold near the example and fail only past it
        sizes = with_far_sizes(sizes, subject.inputs, subject.example)
    if _wants_cleanup(request.cleanup, strategy.name, proto):
        request.tell(f"cleanup and verification ({strategy.name})" if request.verify else f"cleanup ({strategy.name})")
        proto, results = _cleaned(proto, record, request, spill, serialized, sizes)
    else:
        if request.verify:
            request.tell(f"verification ({strategy.name})")
        results = _verified(proto, request, spill, serialized=serialized, sizes=sizes) if request.verify else None
        if request.verify:
            record.timings["verify"] = time.perf_counter() - t1
    record.ok, record.seconds = True, time.perf_counter() - t0
    return Graph(proto, results, record)


def failed(exc: BaseException, record: Attempt, request: ExportRequest, seconds: float,
           search_modules: bool = True) -> Optional[Culprit]:
    """What a failed attempt leaves on its record: its error in one line, its warnings, its culprit
    (returned too, for the ``ExportError``) as the search handed in (``request.diagnose``) finds it.
    ``search_modules=False``: only the culprit the error itself names, not the module-by-module search for
    where wrong numbers start (an export per module), which ``module_culprit`` runs when it is wanted."""
    if isinstance(exc, CaptureError) and exc.warnings is not None:
        record.warnings = {"baked": exc.warnings.baked, "other": exc.warnings.other}
        record.capture, record.acted = exc.warnings.capture, list(exc.warnings.acted)
        record.assumed, record.counted = list(exc.warnings.assumed), list(exc.warnings.counted)
    what = capture.error_line(exc)
    sized = _size_could_be_baked(exc)
    record.error = what + (baked_hint(record.warnings.get("baked", ())) + counted_hint(record.counted, what)
                           if sized else "") + first_cause.outside_weights_hint(exc)
    if record.assumed and not isinstance(exc, CaptureError):  # a graph made, then found wrong: it assumed these
        record.error += f" [the graph assumed: {'; '.join(record.assumed)}]"
    record.stage, record.in_patches = first_cause.stage_of(exc), first_cause.patch_site(exc) if record.patched else None
    # the culprit search re-exports per module under the patches: for the patched attempts only
    found = _culprit(exc, request, what, record.exporter, search_modules) if record.patched else None
    record.culprit = found.line() if found else None
    record.seconds = seconds
    return found


def module_culprit(exc: BaseException, record: Attempt, request: ExportRequest) -> Optional[Culprit]:
    """A failed attempt's culprit with the module-by-module search too, when ``failed`` found none without it:
    for the error of an export that no attempt verified."""
    if record.culprit is not None or not record.patched:
        return None
    found = _culprit(exc, request, capture.error_line(exc), record.exporter, True)
    record.culprit = found.line() if found else None
    return found


def _culprit(exc: BaseException, request: ExportRequest, what: str, exporter: str,
             search_modules: bool) -> Optional[Culprit]:
    if request.diagnose is None:
        return None
    return request.diagnose(exc, request.subject, what, exporter=exporter, atol=request.atol, rtol=request.rtol,
                            patches=request.patches, search_modules=search_modules)


def _size_could_be_baked(exc: BaseException) -> bool:
    """A size frozen by Python code shows as a wrong shape, length or run at other sizes, a static dim,
    or a trace that fails on it; never as values that miss the tolerance with every shape right."""
    if isinstance(exc, VerificationError):
        return not exc.tolerance_only
    if isinstance(exc, ExportError):
        return exc.stage in ("dims", "cleanup") or (exc.__cause__ is not None and _size_could_be_baked(exc.__cause__))
    return isinstance(exc, (CaptureError, DimSpecialized))


def clean_graph(proto: onnx.ModelProto, weights=None, serialized: Optional[bytes] = None):
    """The cleaned graph and the session that runs it (``cleanup.py``)."""
    from onnx_compat.pipeline.cleanup import cleanup_with_session
    return cleanup_with_session(proto, weights, serialized)


def _check_opset(proto: onnx.ModelProto, opset: Optional[int], exporter: str) -> None:
    """``opset=`` is a promise: the dynamo exporter writes 18 when asked for less and its version
    conversion fails, with only a log line to say so."""
    got = next((imp.version for imp in proto.opset_import if imp.domain in ("", "ai.onnx")), None)
    if opset is not None and got != opset:
        raise ExportError(f"{exporter} wrote opset {got}, not the requested opset {opset}", stage="opset")


def _verified(proto, request: ExportRequest, weights=None, serialized=None, **kwargs):
    """Verify the graph as it will be written: fitted to the target first (in place); a graph whose
    weights are in a file is loaded from beside them; ``serialized``, the exporter's bytes of this
    graph, are loaded as they are unless fitting changed it."""
    if releases.fit(proto, request.target):
        serialized = None
    subject = request.subject
    common = dict(atol=request.atol, rtol=request.rtol, runtimes=request.runtimes, example=subject.example,
                  seed=subject.seed + 1, examples=subject.examples, drawing=bool(subject.draws), **kwargs)
    if weights is not None:
        return verify_model(weights.save_graph(proto), subject.model, subject.inputs, subject.outputs, **common)
    return verify_model(proto, subject.model, subject.inputs, subject.outputs, serialized=serialized, **common)


def check_dims(proto, specs: Sequence[TensorSpec], stage: str) -> None:
    problems = graph.static_where_dynamic(proto, dims.wanted_dynamic(specs))
    if problems:
        raise ExportError(stage + "; ".join(problems), stage="cleanup" if stage else "dims")


def _check_cleaned_dims(cleaned, proto, request: ExportRequest, weights, references) -> None:
    """A requested dynamic dim that the cleaned graph holds constant. Either the cleanup lost it, or the
    export computed it from constants all along (a TorchScript trace of ``int(x.shape[0])``) and the
    cleanup's folding only made that visible: the export as written, run at the verification shapes,
    tells which, so the message does not blame the wrong stage."""
    try:
        check_dims(cleaned, request.subject.specs, "")
    except ExportError as exc:
        if references is None or cleaned is proto:
            raise ExportError(f"a requested dynamic dim is constant in the cleaned graph: {exc}", stage="dims") from exc
        try:
            _verified(proto, request, weights, cases=references)
        except VerificationError as baked:
            first = str(baked).strip().splitlines()[0] if str(baked).strip() else type(baked).__name__
            raise ExportError(f"the export froze a dynamic dim (cleanup's folding shows it): {exc}; the graph as "
                              f"exported fails at other sizes too: {first}", stage="dims") from baked
        raise ExportError(f"cleanup lost a dynamic dim: {exc}", stage="cleanup") from exc


def _wants_cleanup(cleanup: Optional[bool], exporter: str, proto: onnx.ModelProto) -> bool:
    """Default: TorchScript exports, and dynamo exports with recurrent nodes (the gate
    reordering of our LSTM/GRU translation folds away); dynamo optimizes the rest itself."""
    if cleanup is not None:
        return cleanup
    return exporter == "torchscript" or any(n.op_type in ("LSTM", "GRU") for n in proto.graph.node)


def _cleaned(proto, record: Attempt, request: ExportRequest, weights=None, serialized=None, sizes=None):
    """Cleanup, then the dims and (with ``verify``) the numbers of the result. ONNX Runtime cleans the graph
    in a second thread while this one runs the eager model for the reference outputs. Verifying the
    cleaned graph alone suffices; only when it fails is the raw export checked, to say whether the
    export or the cleanup is at fault."""
    subject, dropped = request.subject, []  # far checks the eager model refused: said once this graph verifies
    record.nodes_before_cleanup = len(proto.graph.node)
    with ThreadPoolExecutor(1) as pool:
        cleaning = pool.submit(_timed, clean_graph, proto, weights, serialized)
        t0 = time.perf_counter()
        references = reference_cases(subject.model, subject.inputs, subject.outputs, sizes=sizes, example=subject.example,
                                     seed=subject.seed + 1, examples=subject.examples,
                                     first_example_outputs=subject.example_reference,
                                     drawing=bool(subject.draws), notes=dropped) if request.verify else None
        if request.verify:  # the eager model at the verification shapes: the proof's, while ONNX Runtime cleans
            record.timings["references"] = time.perf_counter() - t0
        (cleaned, sess), cleaning_took = cleaning.result()
        t0 = time.perf_counter()
    if len(cleaned.graph.node) > len(proto.graph.node):  # nothing to fold, only rearranged: keep the export
        cleaned, sess = proto, None
    draw_inputs.in_call_order(cleaned, proto)  # node order only: the session computes the same
    _check_cleaned_dims(cleaned, proto, request, weights, references)
    t1 = time.perf_counter()
    record.timings["cleanup"] = cleaning_took + t1 - t0  # the optimiser's own time, not its wait for the references
    if not request.verify:
        return cleaned, None
    try:  # the session that made the graph runs it
        results = _verified(cleaned, request, weights, ort_session=sess, cases=references)
    except VerificationError as exc:
        _verified(proto, request, weights, cases=references)  # raises when the export itself is wrong
        raise ExportError(f"cleanup changed the model's outputs: {exc}", stage="cleanup") from exc
    record.timings["verify"] = time.perf_counter() - t1
    subject.notes.extend(note for note in dropped if note not in subject.notes)
    return cleaned, results


def _timed(fn, *args):
    """``fn(*args)`` and the seconds it took, measured in the thread that runs it."""
    t0 = time.perf_counter()
    return fn(*args), time.perf_counter() - t0


def metadata_entries(subject, exporter: str, user: Optional[Dict[str, str]]) -> Dict[str, str]:
    entries = {
        "onnx_compat.version": __version__,
        "onnx_compat.exporter": exporter,
        "onnx_compat.inputs": json.dumps([s.describe() for s in subject.inputs]),
        "onnx_compat.outputs": json.dumps([s.describe() for s in subject.outputs]),
        "torch.version": torch.__version__,
        "onnx.version": onnx.__version__,
    }
    entries.update(dict(user or {}))
    return entries


def conclude(request: ExportRequest, report: Report, used: Graph) -> None:
    """The used attempt's state and verification on the report; the metadata on the graph, then each step's
    changes and checks (``Step.before_write``)."""
    name, record = used.attempt.exporter, used.attempt
    report.exporter, report.strategy, report.patched = name, record.label, record.patched
    report.assumed = list(record.assumed)
    report.why = used.why or _why(request.exporter, record, report.attempts)
    report.warnings = record.warnings or {"baked": [], "other": []}
    report.repairs, report.nodes_before_cleanup = list(record.repairs), record.nodes_before_cleanup
    report.openvino = list(record.openvino)
    report.timings.update(record.timings)
    if used.results is not None:
        report.verification = [r.to_dict() for r in used.results]
        report.max_abs_err = max((o.max_abs_err for r in used.results for o in r.outputs), default=0.0)
        report.degenerate = sorted({o.name for r in used.results for o in r.outputs if o.degenerate})
        if request.strict and report.degenerate:
            raise ExportError(f"strict: outputs {report.degenerate} are constant at the verified shapes; "
                              "the comparison proves nothing", stage="strict")
    subject = request.subject
    graph.set_metadata(used.proto, metadata_entries(subject, name, request.metadata))
    for step in request.steps:  # each step changes and checks the graph; nothing is written yet
        request.tell(f"step {step.name}")
        step.before_write(request, report, used.proto)
    summary = graph.describe(used.proto)
    for key in ("opset", "ir_version", "inputs", "outputs", "nodes", "ops", "auto_pad", "metadata", "findings"):
        setattr(report, key, summary[key])
    report.findings += subject.notes


def _why(choice: str, used: Attempt, attempts: Sequence[Attempt]) -> str:
    failed = [a for a in attempts if not a.ok]
    if choice != "auto":
        why = "requested"
    elif len({s.name for s in capture.strategies_for("auto")}) == 1 and not failed:
        why = "the only exporter" + only_torchscript()
    elif not failed:
        why = f"{used.label} exported and verified"
    else:
        why = f"fallback: {', '.join(a.label for a in failed)} did not export or verify"
        if any(a.stage == PUT_OFF for a in failed):
            why += " (torchscript's trace depends on the example's sizes: put off, not converted)"
    if used.patched:
        return why
    own = next((a for a in failed if a.exporter == used.exporter and a.patched), None)
    return why + ("; the patches were set aside" +
                  (f" (with them {own.label} failed: {own.error})" if own is not None else ""))


def only_torchscript() -> str:
    from onnx_compat import versions
    return "" if capture.HAS_DYNAMO else f" ({versions.NO_DYNAMO}: TorchScript only)"


def _left_out(request: ExportRequest) -> str:
    """The exporters ``auto`` left out because they cannot capture this model (``Subject.refused_exporter``)."""
    refused = [(name, request.subject.refused_exporter(name)) for name in capture.EXPORTERS]
    return "".join(f" ({name} not tried: {why})" for name, why in refused if why)


def no_graph(request: ExportRequest, attempts: Sequence[Attempt], culprits):
    """The error when every attempt failed: for each exporter its first cause (``first_cause.py``), then
    every other attempt (one that failed the same way only noted beside it), then the culprits found; and
    the attempt named first."""
    heads, others = first_cause.split(attempts)
    head_of = {h.exporter: h for h in heads}
    same = [o for o in others if o.error == head_of[o.exporter].error]
    others = [o for o in others if all(o is not s for s in same)]

    def said(head: Attempt) -> str:
        alike = [_how(o) for o in same if o.exporter == head.exporter]
        return head.error + (f" (the same {', '.join(alike)})" if alike else "")
    if request.exporter != "auto":
        head = heads[0]
        text = f"{head.exporter} export failed" + ("" if head.patched else f" ({_how(head)})") + f": {said(head)}"
    else:
        text = "no exporter produced a verified model" + only_torchscript() + _left_out(request) + ": " + \
            "; ".join(f"{h.label}: {said(h)}" for h in heads)
    text += "".join(f"\n{why}" for why in first_cause.reasons(heads, attempts))
    if others:
        text += "\nalso tried: " + "; ".join(f"{a.label}: {a.error}" for a in others)
    text += "".join(f"\n{a.culprit} ({a.label})" for a in attempts if a.culprit)
    return ExportError(text, attempts=list(attempts), culprits=culprits,
                       stage=heads[0].stage if request.exporter != "auto" else None), heads[0]


def _how(attempt: Attempt) -> str:
    """The way of capturing beside the exporter's name: "without the patches", "draft export", ..."""
    return attempt.label[len(attempt.exporter):].strip(" (),") or "with the patches"


def whole_graph_if_needed(request: ExportRequest, used: Graph, spill):
    """A step that reads the whole model (``Step.needs_whole_graph``: a contract's consumers, quantization):
    weights kept in a file only to spare the export's memory (``weights.works_on_disk``) come back into the
    graph, which is then written as it is."""
    if spill is None or spill.beside or not request.needs_whole_graph:
        return spill
    spill.inline(used.proto)
    return None


def write(request: ExportRequest, report: Report, used: Graph, spill) -> None:
    """The graph (fitted to the target) into place atomically, its weights beside it when spilled, unless a
    step writes the model itself (``Step.writes_model``: quantization); then each step's own files; then what
    each step did on the report."""
    request.tell("writing")
    t0 = time.perf_counter()
    proto = used.proto
    releases.fit(proto, request.target)  # a cleaned graph that was not verified is fitted here
    writer = model_writer(request.steps)
    if writer is not None:  # it records the hash of the proven float model it writes (``report.model_sha256``)
        writer.write_model(request, report, proto)
    else:
        if spill is None:
            report.model_sha256 = write_atomically(proto, request.path)
        else:
            report.model_sha256 = spill.commit(proto)
            report.external_data = os.path.basename(request.path) + ".data" if spill.beside else None
    report.timings["write"] = time.perf_counter() - t0
    for step in request.steps:
        report.files += step.write_files(request, report, os.path.dirname(request.path)) or []
    for step in request.steps:
        described = step.describe()
        if described is not None:
            report.steps[step.name] = described
