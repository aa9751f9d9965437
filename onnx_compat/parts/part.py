"""One graph of a multi-graph model: a callable, its own I/O, and the shared states it reads and writes.

A model a decoder calls in a loop (an encoder, a state initializer, a state
updater, a scorer) is several graphs that hand states to each other. Each
``Part`` names the states it takes (after its inputs, in that order) and
the states it returns (after its outputs). The states themselves are
declared once, as ``StateSpec``s in the PyTorch layout, and shared by every
part, so one state has one dtype and one shape in every graph.

With ``batch_first`` the graphs hold every state with its batch first,
whatever the PyTorch layout (an LSTM's ``[layers, B, H]``): ``PartModule``
moves the axis inside the graph, so the user's callable sees its own layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch

from ..pipeline.adapter import flatten
from onnx_compat.spec import Dim, TensorSpec
from onnx_compat.streaming.states import StateSpec

from .errors import GraphContractError


@dataclass
class Part:
    """One graph. ``fn(*inputs, *states_in) -> (*outputs, *states_out)``, tensors in ONNX order.

    ``state_batch``: the static batch of this graph's states (``1`` for an initializer that makes the
    states of one hypothesis) instead of the batch ``Dim``. ``module``: the module whose weights ``fn``
    uses, when ``fn`` is a plain function. ``metadata``: entries written into this graph. ``steps``: a
    consumer's per-graph deployment steps (its metadata, its rules), run by ``export()`` on the verified
    graph; a part without inputs (a constant graph) runs their ``before_write`` too.
    """

    name: str
    fn: Callable
    inputs: Sequence[TensorSpec] = ()
    outputs: Sequence[TensorSpec] = ()
    states_in: Sequence[str] = ()
    states_out: Sequence[str] = ()
    module: Optional[torch.nn.Module] = None
    state_batch: Optional[int] = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    steps: Sequence = ()  # deployment steps (``pipeline.steps.Step``) run on this graph before it is written

    def state_input_name(self, state: str) -> str:
        """``<s>_in`` when the graph also returns the state, else ``<s>``."""
        return f"{state}_in" if state in self.states_out else state

    def state_output_name(self, state: str) -> str:
        return f"{state}_out" if state in self.states_in else state

    def state_io(self) -> Dict[str, str]:
        """``{graph I/O name: state name}`` for every state this graph reads or writes."""
        return {**{self.state_input_name(s): s for s in self.states_in},
                **{self.state_output_name(s): s for s in self.states_out}}


def batch_axis(spec: StateSpec, batch: str) -> int:
    """The axis of the batch ``Dim`` named ``batch``; a state without it, or with it twice, cannot be batched."""
    axes = [i for i, d in enumerate(spec.dims) if isinstance(d, Dim) and d.name == batch]
    if len(axes) != 1:
        why = "has no" if not axes else f"has {len(axes)}"
        raise GraphContractError(f"state {spec.name!r} {why} axis of the batch dim {batch!r} (dims "
                                 f"{spec.describe()['dims']}): its batch cannot be moved first, so hypotheses' "
                                 "states cannot be stacked", tensor=spec.name, rule="one batch axis per state")
    return axes[0]


def graph_dims(spec: StateSpec, batch: str, batch_first: bool, state_batch: Optional[int]) -> List:
    """The state's dims in a graph: batch first when asked, the batch static where the part says so."""
    dims = list(spec.dims)
    axis = batch_axis(spec, batch)
    if state_batch is not None:
        dims[axis] = state_batch
    if batch_first:
        dims.insert(0, dims.pop(axis))
    return dims


def state_specs(part: Part, states: Mapping[str, StateSpec], batch: str, batch_first: bool):
    """The part's full ``TensorSpec`` lists: its own inputs then its states; its own outputs then its states."""
    def spec(name: str, io_name: str) -> TensorSpec:
        return TensorSpec(io_name, graph_dims(states[name], batch, batch_first, part.state_batch), states[name].dtype)
    inputs = list(part.inputs) + [spec(s, part.state_input_name(s)) for s in part.states_in]
    outputs = list(part.outputs) + [spec(s, part.state_output_name(s)) for s in part.states_out]
    return inputs, outputs


class PartModule(torch.nn.Module):
    """The part as the exporters take it: ``forward(*tensors)`` with batch-first states moved to the user's
    layout before ``fn`` and back after it. The weights' module is a submodule, so it is exported and
    restored with the user's model."""

    def __init__(self, part: Part, states: Mapping[str, StateSpec], batch: str, batch_first: bool) -> None:
        super().__init__()
        owner = part.module if part.module is not None else getattr(part.fn, "__self__", None)
        if isinstance(part.fn, torch.nn.Module):
            owner = part.fn
        self.owner = owner if isinstance(owner, torch.nn.Module) else None
        self.fn = part.fn
        self.n_inputs = sum(len(s.onnx_names) for s in part.inputs)
        self.n_outputs = sum(len(s.onnx_names) for s in part.outputs)
        axes = {name: batch_axis(states[name], batch) for name in list(part.states_in) + list(part.states_out)}
        self.in_axes = [axes[s] if batch_first else 0 for s in part.states_in]
        self.out_axes = [axes[s] if batch_first else 0 for s in part.states_out]
        self.part = part.name

    def forward(self, *tensors: torch.Tensor):
        inputs, states = tensors[:self.n_inputs], tensors[self.n_inputs:]
        states = [s.movedim(0, axis) if axis else s for s, axis in zip(states, self.in_axes)]
        flat = flatten(self.fn(*inputs, *states))
        if len(flat) != self.n_outputs + len(self.out_axes):
            raise GraphContractError(f"graph {self.part!r}: its callable returned {len(flat)} tensors, declared "
                                     f"{self.n_outputs} output(s) and {len(self.out_axes)} state(s)",
                                     graph=self.part, rule="returns its outputs then its states")
        outputs, new = flat[:self.n_outputs], flat[self.n_outputs:]
        return tuple(outputs) + tuple(s.movedim(axis, 0) if axis else s for s, axis in zip(new, self.out_axes))
