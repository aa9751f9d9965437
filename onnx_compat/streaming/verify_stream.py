"""Verification by streaming: the exported step run the way a runtime runs it.

ONNX Runtime calls the graph chunk after chunk, feeding every state output
back as the next call's state input, from the initial states on, for
``chunks`` chunks at each batch size; the same loop runs in eager PyTorch on
the unpatched model (outside every patch, with its own first-call branch
when ``none_first``). Every chunk's outputs and states are compared. Before
that, a state input the graph never reads is an error when the eager step
depends on it; after it, a state the graph returns unchanged while PyTorch
changes it is an error too: both name the state. With ``full_forward`` the
concatenated stream is compared with the whole-utterance forward (its drift).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import torch

from ..graph import subgraphs
from ..runtimes.compare import closeness, degenerate
from ..runtimes.session import open_session
from ..spec import Dim, TensorSpec, make_inputs
from ..pipeline.adapter import flatten
from .errors import StreamMismatch
from .probe import run_step
from .states import StateLayout
from .step import StepModule

_STREAM = "__stream__"


@dataclass(frozen=True)
class Plan:
    """How an utterance is cut: ``chunk`` frames per call, advancing by ``shift`` (the rest is right context)."""

    chunk: int
    shift: int
    right_context: int
    time_axis: int
    chunks: int

    @property
    def length(self) -> int:
        return self.shift * (self.chunks - 1) + self.chunk


def _streamed(spec: TensorSpec, axis: int) -> bool:
    return len(spec.dims) > axis


def make_stream(inputs: Sequence[TensorSpec], sizes: Dict[str, int], plan: Plan, seed: int) -> Dict[str, torch.Tensor]:
    """One random utterance per input, ``plan.length`` frames long on the time axis."""
    long_specs = []
    for spec in inputs:
        dims = list(spec.dims)
        if _streamed(spec, plan.time_axis):
            dims[plan.time_axis] = Dim(_STREAM)
        long_specs.append(TensorSpec(spec.name, dims, spec.dtype, values=spec.values))
    return make_inputs(long_specs, {**sizes, _STREAM: plan.length}, seed=seed)


def chunk_at(inputs: Sequence[TensorSpec], stream: Dict[str, torch.Tensor], plan: Plan, c: int,
             whole: bool = False) -> List[torch.Tensor]:
    """The tensors of call ``c`` in ONNX order (lengths: every frame valid); ``whole``: the whole utterance."""
    out = []
    for spec in inputs:
        tensor = stream[spec.name]
        if _streamed(spec, plan.time_axis) and not whole:
            tensor = tensor.narrow(plan.time_axis, c * plan.shift, plan.chunk)
        out.append(tensor)
        for axis in spec.lengths:
            out.append(torch.full((tensor.shape[0],), tensor.shape[axis], dtype=spec.lengths_dtype))
    return out


@dataclass
class Stream:
    outputs: List[List[torch.Tensor]]  # per chunk, in ONNX output order
    states: List[List[torch.Tensor]]  # per chunk, the states after it
    changed: List[bool]  # per state: did any call change it


def _changed(old: torch.Tensor, new: torch.Tensor) -> bool:
    return old.shape != new.shape or not torch.equal(old, new)


def eager_stream(step: StepModule, inputs, outputs, stream, plan: Plan, init: List[torch.Tensor],
                 none_first: bool) -> Stream:
    result = Stream([], [], [False] * len(init))
    states: List[Optional[torch.Tensor]] = [None] * len(init) if none_first else list(init)
    for c in range(plan.chunks):
        got = run_step(step, chunk_at(inputs, stream, plan, c), states, outputs, plan.chunk)
        before = init if states[0] is None else states
        result.changed = [was or _changed(b, a) for was, b, a in zip(result.changed, before, got.states)]
        result.outputs.append(got.outputs)
        result.states.append(got.states)
        states = got.states
    return result


def onnx_stream(sess, inputs, outputs, layout: StateLayout, stream, plan: Plan, init: List[torch.Tensor],
                batch: int) -> Stream:
    in_names = [n for spec in inputs for n in spec.onnx_names]
    out_names = [n for spec in outputs for n in spec.onnx_names]
    state_out = [s.output for s in layout.flat]
    accepted = {i.name for i in sess.get_inputs()}
    result = Stream([], [], [False] * len(init))
    states = [s.numpy() for s in init]
    for c in range(plan.chunks):
        feeds = {n: np.ascontiguousarray(t.numpy()) for n, t in zip(in_names, chunk_at(inputs, stream, plan, c))}
        feeds.update({s.name: v for s, v in zip(layout.flat, states)})
        try:
            got = sess.run(out_names + state_out, {k: v for k, v in feeds.items() if k in accepted})
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own reason, with where in the stream
            raise StreamMismatch(f"ONNX Runtime fails at chunk {c} of the stream: {type(exc).__name__}: "
                                 f"{str(exc).strip()[:500]}", chunk=c, batch=batch) from exc
        new = got[len(out_names):]
        result.changed = [was or old.shape != n.shape or not np.array_equal(old, n)
                          for was, old, n in zip(result.changed, states, new)]
        result.outputs.append([torch.from_numpy(np.asarray(o)) for o in got[:len(out_names)]])
        result.states.append([torch.from_numpy(np.asarray(s)) for s in new])
        states = [np.asarray(s) for s in new]
    return result


def _error(got: torch.Tensor, want: torch.Tensor) -> Tuple[float, bool]:
    """The largest difference (inf for a shape or NaN/inf that disagrees) and whether the shapes agree."""
    return closeness(got, want, 0.0, 0.0).max_abs_err, got.shape == want.shape


def _close(got, want, atol, rtol) -> bool:
    """The runtime layer's one rule (``runtimes.compare``): exact for integers, NaN/inf where eager has them."""
    return closeness(got, want, atol, rtol).ok


def compare(ours: Stream, ref: Stream, out_names: Sequence[str], layout: StateLayout, batch: int,
            atol: float, rtol: float) -> Dict[str, float]:
    """Max abs error per output and per state over the whole stream; the first disagreement is an error."""
    errors: Dict[str, float] = {}
    for spec, ours_changed, ref_changed in zip(layout.flat, ours.changed, ref.changed):
        if ref_changed and not ours_changed:
            raise StreamMismatch(f"state {spec.name!r}: the graph returns it unchanged ({spec.output!r} = "
                                 f"{spec.name!r}) on every call, while PyTorch's step changes it (batch {batch})",
                                 state=spec.name, batch=batch)
    for c, (got, want) in enumerate(zip(ours.outputs, ref.outputs)):
        for name, g, w in zip(out_names, got, want):
            if not _close(g, w, atol, rtol):
                raise StreamMismatch(f"output {name!r} differs from PyTorch at chunk {c} (batch {batch}): "
                                     f"ONNX {list(g.shape)} vs eager {list(w.shape)}, max abs err {_error(g, w)[0]:.3g}",
                                     output=name, chunk=c, batch=batch)
            errors[name] = max(errors.get(name, 0.0), _error(g, w)[0])
    for c, (got, want) in enumerate(zip(ours.states, ref.states)):
        for spec, g, w in zip(layout.flat, got, want):
            if not _close(g, w, atol, rtol):
                raise StreamMismatch(f"state {spec.name!r} ({spec.output!r}) differs from PyTorch after chunk {c} "
                                     f"(batch {batch}): ONNX {list(g.shape)} vs eager {list(w.shape)}, max abs err "
                                     f"{_error(g, w)[0]:.3g}", state=spec.name, chunk=c, batch=batch)
            errors[spec.output] = max(errors.get(spec.output, 0.0), _error(g, w)[0])
    return errors


def unread_states(proto: onnx.ModelProto, layout: StateLayout) -> List[str]:
    """State inputs no node of the graph (or of a subgraph) reads and no output passes through."""
    read = set()

    def walk(graph):
        for node in graph.node:
            read.update(node.input)
            for sub in subgraphs(node):
                walk(sub)
    walk(proto.graph)
    read.update(o.name for o in proto.graph.output)
    return [s.name for s in layout.flat if s.name not in read]


def check_unread(proto, step: StepModule, inputs, outputs, layout, stream, plan, init) -> None:
    """An unread state input is an error when perturbing it changes the eager step's results."""
    for name in unread_states(proto, layout):
        refuse_ignored(name, step, inputs, outputs, layout, stream, plan, init)


def refuse_ignored(name: str, step: StepModule, inputs, outputs, layout, stream, plan, init) -> None:
    """The graph does not read state ``name``: an error naming it if the eager step depends on it."""
    k = [s.name for s in layout.flat].index(name)
    chunk = chunk_at(inputs, stream, plan, 0)
    base = run_step(step, chunk, init, outputs, plan.chunk)
    moved = list(init)
    moved[k] = _perturbed(init[k])
    other = run_step(step, chunk, moved, outputs, plan.chunk)
    if any(_changed(a, b) for a, b in zip(base.outputs + base.states, other.outputs + other.states)):
        raise StreamMismatch(f"state {name!r}: the graph ignores this input, but PyTorch's step depends on it (its "
                             "results change when the state does); a state read through .item(), float(), int() "
                             "or .tolist() is frozen by a trace: compute with it as a tensor", state=name)


def _perturbed(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t + torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype).reshape(t.shape)
    return t + 1


def drift(full_forward: Callable, inputs, outputs: Sequence[TensorSpec], stream, plan: Plan,
          chunks: Sequence[Sequence[torch.Tensor]]) -> Dict[str, float]:
    """Max abs difference between the concatenated stream and the whole-utterance forward, per output with time."""
    with torch.no_grad():
        given = [t.clone() for t in chunk_at(inputs, stream, plan, 0, whole=True)]  # the stream stays as it was
        full = flatten(full_forward(*given))
    names = [n for spec in outputs for n in spec.onnx_names]
    found: Dict[str, float] = {}
    for k, (name, whole) in enumerate(zip(names, full)):
        if whole.dim() <= plan.time_axis or chunks[0][k].dim() <= plan.time_axis:
            continue
        streamed = torch.cat([c[k] for c in chunks], dim=plan.time_axis)
        n = min(streamed.shape[plan.time_axis], whole.shape[plan.time_axis])
        a, b = streamed.narrow(plan.time_axis, 0, n), whole.narrow(plan.time_axis, 0, n)
        found[name] = closeness(a, b, 0.0, 0.0).max_abs_err  # inf for another shape or a NaN on one side only
    return found


def verify_stream(model_bytes: bytes, proto: onnx.ModelProto, step: StepModule, inputs, outputs, layout: StateLayout,
                  plan: Plan, batches: Sequence[int], sizes: Dict[str, int], batch_dim: Optional[str],
                  init_fn: Optional[Callable], none_first: bool, full_forward: Optional[Callable],
                  atol: float, rtol: float, seed: int) -> List[dict]:
    """One entry per batch size, shaped like ``export()``'s verification entries (``summary()`` prints them)."""
    sess = open_session(model_bytes)
    out_names = [n for spec in outputs for n in spec.onnx_names]
    entries = []
    for k, batch in enumerate(batches):
        at = {**sizes, **({batch_dim: batch} if batch_dim else {})}
        stream = make_stream(inputs, at, plan, seed + k)
        init = layout.initial(at, init_fn, batch)
        if k == 0:
            check_unread(proto, step, inputs, outputs, layout, stream, plan, init)
        ref = eager_stream(step, inputs, outputs, stream, plan, init, none_first)
        ours = onnx_stream(sess, inputs, outputs, layout, stream, plan, init, batch)
        try:
            errors = compare(ours, ref, out_names, layout, batch, atol, rtol)
        except StreamMismatch as exc:
            if none_first and exc.chunk == 0 and not _init_means_none(step, inputs, outputs, stream, plan, init, ref):
                raise StreamMismatch(f"{exc} [none_first: PyTorch's first call took the model's own None branch, "
                                     "the graph's started from the declared initial states: they are not what None "
                                     "means; give init_states=]", state=exc.state, output=exc.output, chunk=0,
                                     batch=batch) from exc
            raise
        signals = [spec.name for spec in outputs]  # lengths are constant in a stream of full chunks
        checks = [{"name": n, "max_abs_err": e, "max_rel_err": None, "ok": True,
                   "degenerate": n in signals and _flat(ref, n, out_names)} for n, e in errors.items()]
        entry = {"sizes": {**at, "chunks": plan.chunks}, "outputs": checks, "error": None, "example": False,
                 "runtime": None, "stream": True, "ok": True}
        if full_forward is not None:
            entry["drift"] = drift(full_forward, inputs, outputs, stream, plan, ours.outputs)
            entry["drift_eager"] = drift(full_forward, inputs, outputs, stream, plan, ref.outputs)
        entries.append(entry)
    return entries


def _flat(ref: Stream, name: str, out_names: Sequence[str]) -> bool:
    """An output that is degenerate over the whole stream (``runtimes.compare``: zeros, a constant) proves nothing."""
    if name not in out_names:
        return False
    k = out_names.index(name)
    return degenerate(torch.cat([c[k].reshape(-1).double() for c in ref.outputs])) is not None


def _init_means_none(step, inputs, outputs, stream, plan: Plan, init, ref: Stream) -> bool:
    """Does the eager step from the initial states give what it gave from ``None`` on the first chunk?"""
    got = run_step(step, chunk_at(inputs, stream, plan, 0), init, outputs, plan.chunk)
    return all(not _changed(a, b) for a, b in zip(got.outputs + got.states, ref.outputs[0] + ref.states[0]))
