"""The eager pre-pass: what one call of the step says about the declared contract.

Run before any export, on the unpatched model, so that bad declarations and
the patterns that make a streaming export silently wrong are found with the
state, attribute or buffer that causes them, and nothing is written:

- the step returns one tensor per output and per state (a state without a
  paired output, or a state too many, is named);
- every new state has the declared dtype and shape; only named dims change
  between calls (a ``past`` that grows), fixed sizes never;
- a Python number on the module that changes during a call (a frame counter
  ``self.offset += T``) would be frozen into the graph at its traced value:
  refused, naming the attribute;
- a buffer the step writes (a cache kept on the module, updated in place)
  is invisible to ONNX: refused, naming the buffer;
- a state tensor the step updates in place is noted: ``StepModule`` hands the
  step a copy, so both exporters see an ordinary tensor update.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..spec import Dim, TensorSpec
from ..pipeline.adapter import flatten
from .errors import StreamingError
from .python_reads import PythonRead, StateReads, named
from .states import StateLayout
from .step import StepModule

_SCALARS = (int, float, bool)


@dataclass
class StepResult:
    outputs: List[torch.Tensor]
    states: List[torch.Tensor]
    updated_in_place: List[str] = field(default_factory=list)
    python_reads: List[PythonRead] = field(default_factory=list)


def _module_scalars(owner: Optional[torch.nn.Module]) -> Dict[Tuple[str, str], object]:
    if owner is None:
        return {}
    return {(path, key): value for path, m in owner.named_modules() for key, value in vars(m).items()
            if isinstance(value, _SCALARS) and not key.startswith("_") and key != "training"}


def _module_buffers(owner: Optional[torch.nn.Module]) -> Dict[str, torch.Tensor]:
    if owner is None:
        return {}
    return {name: b.detach().clone() for name, b in owner.named_buffers()}


def run_step(step: StepModule, chunk: Sequence[torch.Tensor], states: Sequence[Optional[torch.Tensor]],
             outputs: Sequence[TensorSpec], chunk_size: int, watch: bool = False) -> StepResult:
    """One eager call (no patches, no grad), its result split into outputs and states and checked for count."""
    layout = step.layout
    before_scalars, before_buffers = (_module_scalars(step.owner), _module_buffers(step.owner)) if watch else ({}, {})
    given = [None if s is None else s.clone() for s in states]
    reads = StateReads(named(given, [s.name for s in layout.flat])) if watch else contextlib.nullcontext()
    with torch.no_grad(), reads:
        try:
            result = step.call([c.clone() for c in chunk], given)  # own copies: a step may write into its input
        except Exception as exc:  # noqa: BLE001 - the model's own refusal, reported with the chunk size
            raise StreamingError(f"the step refuses a chunk of {chunk_size} frames (batch {chunk[0].shape[0]}): "
                                 f"{type(exc).__name__}: {exc}", chunk=chunk_size, batch=int(chunk[0].shape[0])) from exc
    if watch:
        _check_module_unchanged(step.owner, before_scalars, before_buffers)
    flat = flatten(result)
    n_out = sum(len(spec.onnx_names) for spec in outputs)
    _check_count(len(flat), n_out, layout)
    in_place = [spec.name for spec, old, new in zip(layout.flat, states, given)
                if old is not None and new is not None and (old.shape != new.shape or not torch.equal(old, new))]
    return StepResult(list(flat[:n_out]), list(flat[n_out:]), in_place, reads.reads if watch else [])


def _check_count(returned: int, n_out: int, layout: StateLayout) -> None:
    wanted = n_out + len(layout)
    if returned == wanted:
        return
    names = [s.name for s in layout.flat]
    if returned < wanted:
        missing = names[max(returned - n_out, 0):]
        raise StreamingError(f"state {missing[0]!r} has no paired output: the step returned {returned} tensors, "
                             f"{n_out} outputs and {len(names)} states are declared (unpaired: {missing})",
                             state=missing[0])
    raise StreamingError(f"the step returned {returned} tensors, {returned - wanted} more than the {n_out} outputs "
                         f"and {len(names)} states declared ({names}): declare every state it returns",
                         state=names[-1])


def _check_module_unchanged(owner, scalars, buffers) -> None:
    for (path, key), value in _module_scalars(owner).items():
        old = scalars.get((path, key), value)
        if old != value:
            where = f"{path}.{key}" if path else key
            raise StreamingError(
                f"module attribute {where!r} changed from {old!r} to {value!r} during one step: a Python number is "
                f"frozen into the graph at its traced value; keep it in a state tensor instead",
                module=path or type(owner).__name__, attribute=key)
    for name, value in _module_buffers(owner).items():
        if name in buffers and (value.shape != buffers[name].shape or not torch.equal(value, buffers[name])):
            raise StreamingError(f"buffer {name!r} was written during one step: a cache kept on the module is not an "
                                 "input or output of the graph; pass it in and return it as a state",
                                 module=name.rpartition(".")[0] or type(owner).__name__, attribute=name)


def check_states(layout: StateLayout, before: Sequence[Optional[torch.Tensor]], after: Sequence[torch.Tensor],
                 sizes: Mapping[str, int]) -> Dict[str, str]:
    """Each new state against its declaration; returns ``{state: dim name}`` of the dims that grew."""
    grown: Dict[str, str] = {}
    for spec, old, new in zip(layout.flat, before, after):
        if not isinstance(new, torch.Tensor):
            raise StreamingError(f"state {spec.name!r}: the step returned a {type(new).__name__}", state=spec.name)
        if new.dtype != spec.dtype:
            raise StreamingError(f"state {spec.name!r}: the step returns {str(new.dtype).replace('torch.', '')}, "
                                 f"declared {str(spec.dtype).replace('torch.', '')}", state=spec.name)
        if new.dim() != len(spec.dims):
            raise StreamingError(f"state {spec.name!r}: declared rank {len(spec.dims)}, the step returns "
                                 f"{list(new.shape)}", state=spec.name)
        for axis, (dim, size) in enumerate(zip(spec.dims, new.shape)):
            if isinstance(dim, int) and size != dim:
                raise StreamingError(f"state {spec.name!r} dim {axis} changes between calls: declared {dim}, the "
                                     f"step returns {size} (shape {list(new.shape)}); only named dims may change",
                                     state=spec.name)
            if isinstance(dim, Dim) and dim.name in sizes and size != sizes[dim.name]:
                raise StreamingError(f"state {spec.name!r} dim {axis} ({dim.name!r}) is {size} after a call, "
                                     f"{sizes[dim.name]} in the inputs", state=spec.name)
            if isinstance(dim, Dim) and old is not None and size != old.shape[axis]:
                grown[spec.name] = dim.name
    return grown
