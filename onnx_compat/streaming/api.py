"""``export_streaming``: one call of a step exported, then proven by running the stream.

declarations -> eager pre-pass on the unpatched model (counts, shapes, dtypes,
module attributes and buffers; the export example is the state after two
real chunks) -> for each exporter: ``onnx_compat.export(..., verify=False)``
into a temporary folder beside ``path`` -> streaming verification in ONNX
Runtime at two batch sizes -> rename into place. Nothing is written unless
the stream agreed with PyTorch; with ``exporter="auto"`` TorchScript goes
first and a graph that fails the stream check hands over to dynamo, as
``export()`` does.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import onnx
import torch

from ..errors import ArgumentError, ArgumentTypeError, reraise_interrupt
from ..spec import Dim, TensorSpec
from ..model_state import preserved
from ..pipeline.files import check_writable
from ..pipeline.report import Attempt, Report
from ..versions import HAS_DYNAMO
from .batch_axis import check_second_batch
from .contract import contract_entry, contracted, declared_contract, is_contract_error
from .errors import StreamDrift, StreamingError, StreamMismatch
from .metadata import streaming_metadata
from .probe import check_states, run_step
from .shapes import stamp_state_dims
from .states import StateLayout
from .step import StepModule, accepts_inputs, step_name, unfed_parameters
from .verify_stream import Plan, chunk_at, make_stream, refuse_ignored, verify_stream


def _specs(specs, what: str) -> List[TensorSpec]:
    specs = [specs] if isinstance(specs, TensorSpec) else list(specs or ())
    if not all(isinstance(s, TensorSpec) for s in specs) or (what == "inputs" and not specs):
        raise ArgumentTypeError(f"{what} must be a TensorSpec or a list of TensorSpec", argument=what, value=specs)
    return specs


@dataclass
class _Declared:
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    layout: StateLayout
    plan: Plan
    batch_dim: Optional[str]
    sizes: Dict[str, int]  # the export example's named sizes


def _declare(inputs, states, outputs, chunk, shift, right_context, time_axis, chunks) -> _Declared:
    inputs, outputs, layout = _specs(inputs, "inputs"), _specs(outputs, "outputs"), StateLayout(states)
    names = [n for s in inputs + outputs for n in s.onnx_names]
    for spec in layout.flat:
        for name in (spec.name, spec.output):
            if name in names:
                raise StreamingError(f"state {spec.name!r}: {name!r} is also a declared input or output; a state's "
                                     "input and output are declared by its StateSpec alone", state=spec.name)
    first = inputs[0]
    if len(first.dims) <= time_axis:
        raise StreamingError(f"input {first.name!r} has no time axis {time_axis}")
    declared = first.dims[time_axis]
    if isinstance(declared, int):
        if chunk is not None and chunk != declared:
            raise StreamingError(f"chunk={chunk} but input {first.name!r} declares {declared} frames per call",
                                 chunk=chunk)
        chunk = declared
    elif chunk is None:
        raise StreamingError(f"input {first.name!r} has a named time dim {declared.name!r}: give chunk=")
    if chunks < 5:
        raise StreamingError(f"chunks={chunks}: the stream check needs at least 5 chunks", chunk=chunk)
    if not isinstance(right_context, int) or right_context < 0:
        raise StreamingError(f"right_context={right_context!r} must be an int >= 0 (look-ahead frames)", chunk=chunk)
    if shift is None and right_context >= chunk:
        raise StreamingError(f"right_context={right_context} leaves no new frame in a chunk of {chunk}: each call "
                             f"reads chunk frames of which the last right_context are look-ahead, so right_context "
                             f"must be less than chunk", chunk=chunk)
    shift = chunk - right_context if shift is None else shift
    if not 0 < shift <= chunk:
        raise StreamingError(f"shift={shift} must be in 1..chunk ({chunk})", chunk=chunk)
    batch = first.dims[0] if isinstance(first.dims[0], Dim) else None
    sizes = {batch.name: batch.example or 2} if batch else {}
    if isinstance(declared, Dim):
        sizes[declared.name] = chunk
    for spec in inputs:
        for dim in spec.dynamic_axes().values():
            sizes.setdefault(dim.name, dim.example or max(dim.min, 8))
    plan = Plan(chunk, shift, right_context, time_axis, chunks)
    return _Declared(inputs, outputs, layout, plan, batch.name if batch else None, sizes)


def _example(step: StepModule, d: _Declared, init_fn, none_first: bool, seed: int):
    """Two real chunks through the eager step, every contract checked; the third call's inputs are the example."""
    batch = d.sizes.get(d.batch_dim, 1) if d.batch_dim else 1
    stream = make_stream(d.inputs, d.sizes, d.plan, seed)
    init = d.layout.initial(d.sizes, init_fn, batch)
    _check_initial(d.layout, init, d.sizes)
    states = [None] * len(init) if none_first else init
    grown: Dict[str, str] = {}
    in_place: List[str] = []
    reads: List = []
    for c in range(3):
        chunk = chunk_at(d.inputs, stream, d.plan, c)
        try:
            got = run_step(step, chunk, states, d.outputs, d.plan.chunk, watch=True)
        except StreamingError as exc:
            raise _empty_hint(exc, d, init) from exc
        grown.update(check_states(d.layout, init if states[0] is None else states, got.states, d.sizes))
        in_place += [n for n in got.updated_in_place if n not in in_place]
        reads += [r for r in got.python_reads if r not in reads]
        if c == 2:
            break
        states = got.states
    names = [n for s in d.inputs for n in s.onnx_names]
    # contiguous copies: a narrowed view's strides reach the dynamo exporter as symbolic strides it cannot export
    example = {**dict(zip(names, chunk)), **{s.name: v for s, v in zip(d.layout.flat, states)}}
    example = {k: v.contiguous().clone() for k, v in example.items()}
    return example, grown, in_place, reads


def _empty_hint(exc: StreamingError, d: _Declared, init: List[torch.Tensor]) -> StreamingError:
    """A step that fails on a state that starts empty: say which named dim made it empty."""
    for spec, value in zip(d.layout.flat, init):
        empty = [dim.name for dim, size in zip(spec.dims, value.shape) if isinstance(dim, Dim) and size == 0]
        if empty and exc.state is None:
            return StreamingError(f"{exc} [state {spec.name!r} starts empty along {empty[0]!r}: a named dim that "
                                  "no input has grows from 0; if it is the batch, give it the inputs' Dim name]",
                                  state=spec.name, chunk=exc.chunk, batch=exc.batch)
    return exc


def _check_initial(layout: StateLayout, init: List[torch.Tensor], sizes: Mapping[str, int]) -> None:
    for spec, value in zip(layout.flat, init):
        for axis, (dim, size) in enumerate(zip(spec.dims, value.shape)):
            if (isinstance(dim, int) and dim != size) or (isinstance(dim, Dim) and dim.name in sizes
                                                          and sizes[dim.name] != size):
                raise StreamingError(f"state {spec.name!r}: its initial value has shape {list(value.shape)}, "
                                     f"declared {spec.describe()['dims']} (dim {axis})", state=spec.name)
        if len(spec.dims) != value.dim():
            raise StreamingError(f"state {spec.name!r}: its initial value has rank {value.dim()}, declared "
                                 f"{len(spec.dims)}", state=spec.name)


def _graph_specs(d: _Declared, grown: Dict[str, str]):
    """Specs ``export()`` sees: chunk inputs then states; outputs then new states (a grown dim renamed)."""
    inputs = [TensorSpec(s.name, s.dims, s.dtype, s.lengths, s.lengths_dtype, values=s.values) for s in d.inputs]
    inputs += [s.input_spec() for s in d.layout.flat]
    outputs = list(d.outputs)
    for spec in d.layout.flat:
        dims = [Dim(f"{dim.name}_next") if isinstance(dim, Dim) and grown.get(spec.name) == dim.name else dim
                for dim in spec.dims]
        outputs.append(TensorSpec(spec.output, dims, spec.dtype))
    return inputs, outputs


def export_streaming(step: Callable, path: str, inputs, states, outputs, *, init_states: Optional[Callable] = None,
                     full_forward: Optional[Callable] = None, exporter: str = "auto", chunk: Optional[int] = None,
                     shift: Optional[int] = None, right_context: int = 0, time_axis: int = 1, chunks: int = 6,
                     batches: Optional[Sequence[int]] = None, none_first: bool = False,
                     module: Optional[torch.nn.Module] = None, max_drift: Optional[float] = None,
                     atol: float = 1e-4, rtol: float = 1e-3, metadata: Optional[Mapping[str, str]] = None,
                     opset: Optional[int] = None, seed: int = 0, contract: Optional[str] = None,
                     vocabulary: Optional[Sequence[str]] = None) -> Report:
    """Export one call of ``step`` with its states as named inputs/outputs; prove it by streaming.

    ``step(*chunk_inputs, *state_args)`` returns the outputs then the new
    states (nested as it likes; flattened in order). ``states``: one item per
    state argument, a ``StateSpec`` or a nested list/tuple of them.
    ``init_states(batch)``: the initial states (nested like the arguments),
    else each ``StateSpec.init``. ``none_first``: the eager reference's first
    call passes ``None`` for every state (the model's own first-chunk branch);
    the graph's stream starts from the initial states, so the two agree only
    if those are what ``None`` means. ``chunk``/``shift``/``right_context``:
    frames per call, frames advanced per call, lookahead frames (metadata and
    how the verification cuts an utterance along ``time_axis``).
    ``full_forward(*whole_inputs)``: the whole-utterance forward; the report
    gives each output's drift from it (an error past ``max_drift``: None is
    the default ``DEFAULT_MAX_DRIFT``, 1e-3, a number overrides it,
    ``math.inf`` turns the check off).
    ``batches``: the stream's batch sizes (default 1 and the example's + 1);
    ``chunks``: calls per stream (>= 5). ``module``: the module a plain
    function's weights live in (a bound method or a module is found itself).
    ``contract``: a consumer's streaming contract (``"sherpa-onnx/online-nemo-ctc"``, with ``vocabulary``):
    the declarations checked before the pre-pass, the graph before writing (its metadata derived from the
    ``StateSpec``s, ``chunk`` and ``shift``), the stream decoded inside the consumer; its files beside ``path``.
    """
    t_start = time.perf_counter()
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise ArgumentError(f"unknown exporter {exporter!r}; choose from ('dynamo', 'torchscript', 'auto')",
                            argument="exporter", value=exporter)
    d = _declare(inputs, states, outputs, chunk, shift, right_context, time_axis, chunks)
    the_contract = declared_contract(contract, d, vocabulary)
    _check_step_takes(step, d)
    written = check_writable(path)
    step_module = StepModule(step, d.inputs, d.layout, module)
    with preserved(step_module):
        job = _prepare(step_module, step_name(step), d, init_states, none_first, full_forward, batches, metadata,
                       opset, seed, atol, rtol, max_drift)
        job.contract, job.vocabulary, job.contract_metadata = the_contract, vocabulary, dict(metadata or {})
        order = (["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"]) if exporter == "auto" else [exporter]
        return _first_streamed(order, job, written, exporter, t_start)


def _check_step_takes(step: Callable, d: _Declared) -> None:
    """The step must take the declared chunk inputs and state arguments positionally; checked before the pre-pass
    so a missing ``StateSpec`` is named as such, not as a ``TypeError`` from inside the first eager call."""
    n_args = sum(1 for s in d.inputs for name in [s.arg] + [s.length_args.get(a) for a in s.lengths] if name is None)
    if accepts_inputs(step, n_args + len(d.layout.items)):
        return
    unfed = unfed_parameters(step, n_args + len(d.layout.items))
    if unfed:  # the step takes more states than are declared: name the parameters left without one
        raise StreamingError(f"{step_name(step)} takes parameter(s) {unfed} after its {n_args} chunk input(s) and "
                             f"{len(d.layout.items)} declared state argument(s): declare a StateSpec for "
                             f"{unfed[0]!r} in states= (in the step's argument order)", state=unfed[0])
    raise StreamingError(f"{step_name(step)} cannot take {n_args} chunk input(s) and {len(d.layout.items)} state "
                         f"argument(s) positionally (it takes fewer); check inputs= and states=")


def _first_streamed(order: List[str], job: "_Job", written: str, exporter: str, t_start: float) -> Report:
    """The first exporter in ``order`` whose graph streams like PyTorch. An exporter that fails or streams wrong
    hands over to the next; the step's, the user's or a contract's error is raised at once, since another
    exporter cannot mend it; when none is left, one error names every attempt."""
    attempts: List[Attempt] = []
    failures: List[Exception] = []
    for name in order:
        t0 = time.perf_counter()
        try:
            report = _attempt(name, job, written)
        except Exception as exc:  # noqa: BLE001 - recorded; raised below when no exporter is left
            reraise_interrupt(exc)  # Ctrl-C is never an exporter that failed
            if isinstance(exc, StreamingError) and not isinstance(exc, StreamMismatch) \
                    or isinstance(exc, StreamDrift) or is_contract_error(exc):  # the step's or the user's fault
                raise
            attempts.append(Attempt(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0))
            failures.append(exc)
            continue
        report.attempts = attempts + report.attempts
        report.why = "requested" if exporter != "auto" else \
            f"{name} exported and streamed" if name == order[0] else f"fallback: {order[0]} did not export or stream"
        if job.in_place:
            report.repairs.append(f"states updated in place by the step, given copies: {job.in_place}")
        report.timings["total"] = time.perf_counter() - t_start
        return report
    raise _no_exporter(attempts, failures)


@dataclass
class _Job:
    """Everything an exporter attempt needs, settled before the first one."""

    step: StepModule
    declared: _Declared
    graph_inputs: List[TensorSpec]
    graph_outputs: List[TensorSpec]
    example: Dict[str, torch.Tensor]
    metadata: Dict[str, str]
    in_place: List[str]
    reads: list  # PythonRead: states the step reads as Python values
    batches: List[int]
    init_states: Optional[Callable]
    none_first: bool
    full_forward: Optional[Callable]
    opset: Optional[int]
    seed: int
    atol: float
    rtol: float
    max_drift: Optional[float]
    contract: Optional[object] = None  # contracts.Contract of a streaming consumer
    vocabulary: Optional[Sequence[str]] = None
    contract_metadata: Optional[Dict[str, str]] = None  # the user's metadata, checked by the contract


def _prepare(step_module, name, d: _Declared, init_states, none_first, full_forward, batches, metadata, opset, seed,
             atol, rtol, max_drift) -> _Job:
    """The eager pre-pass (at the example's batch size and one more), the graph's specs and metadata, and the
    verification's batch sizes."""
    example, grown, in_place, reads = _example(step_module, d, init_states, none_first, seed)
    check_second_batch(step_module, d, init_states, none_first, seed + 7)  # a batch axis declared on the wrong axis
    graph_inputs, graph_outputs = _graph_specs(d, grown)
    first, second = (d.layout.initial({**d.sizes, **({d.batch_dim: b} if d.batch_dim else {})}, init_states, b)
                     for b in (1, 2))
    meta = streaming_metadata(d.layout, first, d.plan.chunk, d.plan.shift, d.plan.right_context, d.plan.time_axis,
                              name, grown, metadata or {}, second, d.batch_dim)
    batch_ex = d.sizes.get(d.batch_dim, 1) if d.batch_dim else 1
    batches = list(batches or ([1, batch_ex + 1] if d.batch_dim else [1]))
    return _Job(step_module, d, graph_inputs, graph_outputs, example, meta, in_place, reads, batches, init_states,
                none_first, full_forward, opset, seed, atol, rtol, max_drift)


def _no_exporter(attempts: List[Attempt], failures: List[Exception]) -> Exception:
    """The stream's own error (with its culprit fields) when a graph was made; else the exporters' ``ExportError``."""
    from onnx_compat.errors import ExportError
    text = "; ".join(f"{a.exporter}: {a.error}" for a in attempts)
    first = next((f for f in failures if isinstance(f, StreamingError)), None)
    if first is None:
        return ExportError("no exporter produced a graph of the step: " + text)
    fields = {k: getattr(first, k) for k in ("state", "output", "chunk", "batch")}
    return StreamMismatch("no exporter produced a graph that streams like PyTorch: " + text,
                          exporter=attempts[-1].exporter, **fields)


def _attempt(name: str, job: _Job, written: str) -> Report:
    """One exporter: the graph into a temporary folder beside ``written``, streamed, then renamed into place."""
    from onnx_compat.graph import describe
    from onnx_compat.api import export
    d = job.declared
    with tempfile.TemporaryDirectory(prefix=".streaming-", dir=os.path.dirname(written)) as folder:
        tmp = os.path.join(folder, os.path.basename(written))
        try:
            report = export(job.step, tmp, job.graph_inputs, job.graph_outputs, exporter=name, verify=False,
                            examples=[job.example], metadata=job.metadata, opset=job.opset, seed=job.seed,
                            external_data=False)
        except Exception as exc:
            _name_dropped_state(exc, job.step, d, job.init_states, job.seed)
            raise
        proto = onnx.load(tmp)
        stamped = stamp_state_dims(proto, d.layout)
        if stamped:
            report.repairs.append("declared state sizes written into the graph's outputs: " + "; ".join(stamped))
            onnx.save(proto, tmp)
            report.outputs = describe(proto)["outputs"]
        t1 = time.perf_counter()
        try:
            entries = verify_stream(proto.SerializeToString(), proto, job.step, d.inputs, d.outputs, d.layout, d.plan,
                                    job.batches, d.sizes, d.batch_dim, job.init_states, job.none_first,
                                    job.full_forward, job.atol, job.rtol, job.seed + 1)
        except StreamMismatch as exc:
            raise _with_cause(exc, name, report, job.reads) from exc
        _check_drift(entries, job.max_drift)
        report.findings += [f"{r.text()}: a trace would freeze it; this graph streamed right" for r in job.reads]
        report.timings["verify_stream"] = time.perf_counter() - t1
        applied = contracted(job, proto, tmp) if job.contract is not None else None
        os.replace(tmp, written)
        if applied is not None:
            report.files += applied.write_files(os.path.dirname(written))
            report.steps[applied.contract.name] = contract_entry(applied)
    report.path = written
    report.verification = entries
    report.max_abs_err = max((o["max_abs_err"] for e in entries for o in e["outputs"]), default=0.0)
    report.degenerate = sorted({o["name"] for e in entries for o in e["outputs"] if o["degenerate"]})
    return report


def _with_cause(exc: StreamMismatch, exporter: str, report: Report, reads) -> StreamMismatch:
    """A mismatch after a trace that froze values: the state read as a Python value (or the warning) as the cause."""
    # a number read from a tensor (.item(), int()) first: the usual cache-slicing culprit
    baked = sorted(report.warnings.get("baked", []), key=lambda w: "Python number" not in w)
    if exporter != "torchscript" or not (baked or reads):
        return exc
    cause = "; ".join(r.text() for r in reads) or baked[0]
    return StreamMismatch(f"{exc} [the {exporter} trace froze a value the step computed in Python ({cause}): a cache "
                          "sliced by a length read with .item()/int() runs right only at the chunk it was traced at; "
                          "compute it with tensor ops (keep the cache at full size and mask the slots not filled yet by the "
                          "counter as a tensor), or export with exporter='dynamo', which keeps the number symbolic]", state=exc.state or (reads[0].state if reads else None),
                          output=exc.output, chunk=exc.chunk, batch=exc.batch, exporter=exporter)


DEFAULT_MAX_DRIFT = 1e-3  # max abs difference of the concatenated stream from the full forward, by default


def _check_drift(entries: List[dict], max_drift: Optional[float]) -> None:
    """Given a full forward, a stream that drifts from it is wrong unless the user says how far it may
    (``max_drift``: None is the default, ``math.inf`` turns the check off)."""
    limit = DEFAULT_MAX_DRIFT if max_drift is None else float(max_drift)
    said = f"max_drift=None: the default {DEFAULT_MAX_DRIFT:.0e}".replace("e-03", "e-3") if max_drift is None \
        else f"max_drift={max_drift:g}"
    for entry in entries:
        for output, value in entry.get("drift", {}).items():
            if not value <= limit:
                eager = entry.get("drift_eager", {}).get(output)
                raise StreamDrift(f"output {output!r}: the concatenated stream drifts {value:.3g} from the full "
                                     f"forward ({said}) at {entry['sizes']}"
                                     + (f"; PyTorch's own stream drifts {eager:.3g}" if eager is not None else "")
                                     + ": the step and full_forward disagree (other weights, or a context the "
                                     "stream does not see); pass max_drift= a number to allow it, math.inf to "
                                     "turn the check off", output=output)


_DROPPED = re.compile(r"'([^']+)' is not in the graph")


def _name_dropped_state(exc: Exception, step_module, d: _Declared, init_states, seed: int) -> None:
    """``export()`` refuses a graph that dropped an input; when the input is a state, say so by its name."""
    found = _DROPPED.search(str(exc))
    names = [s.name for s in d.layout.flat]
    if not found or found.group(1) not in names:
        return
    batch = d.sizes.get(d.batch_dim, 1) if d.batch_dim else 1
    init = d.layout.initial(d.sizes, init_states, batch)
    refuse_ignored(found.group(1), step_module, d.inputs, d.outputs, d.layout, make_stream(d.inputs, d.sizes, d.plan, seed),
                   d.plan, init)
