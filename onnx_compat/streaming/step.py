"""A step callable seen as the ``nn.Module`` with flat tensors that the exporters take.

``StepModule(step, inputs, layout)``: ``forward(*chunk_inputs, *flat_states)``
calls the user's step with the states nested as it wants them and returns
everything it gives back, flat. A bound method of a module
(``model.streaming_forward``, ``emformer.infer``) keeps that module as a
submodule, so its weights are the graph's weights, and restoring the
module after an export restores the user's model.

State inputs are cloned before the step sees them: a step that updates its
cache in place (``cache[:, :-T] = cache[:, T:].clone()``) then writes into a
copy, which both exporters translate; in place on the graph input itself,
the update can vanish and the state come back unchanged.
"""
from __future__ import annotations

import inspect
from typing import Callable, List, Optional, Sequence

import torch

from ..errors import ArgumentTypeError
from ..spec import TensorSpec
from ..pipeline.adapter import flatten
from .states import StateLayout


def owner_of(step: Callable) -> Optional[torch.nn.Module]:
    """The module whose weights the step uses, when it says so (a module, or a module's bound method)."""
    if isinstance(step, torch.nn.Module):
        return step
    owner = getattr(step, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


class StepModule(torch.nn.Module):
    def __init__(self, step: Callable, inputs: Sequence[TensorSpec], layout: StateLayout,
                 module: Optional[torch.nn.Module] = None) -> None:
        super().__init__()
        if not callable(step):
            raise ArgumentTypeError(f"step must be callable (a module or a method such as model.streaming_forward), "
                                    f"got {type(step).__name__}", argument="step")
        owner = owner_of(step) or module
        self.owner = owner  # registered: its weights are exported and preserved
        self._method = None if isinstance(step, torch.nn.Module) or owner_of(step) is None else step.__func__
        self._fn = None if owner_of(step) is not None else step
        # ONNX order: each tensor, then its lengths; a name is a keyword argument of the step, None positional
        self.arg_names = [name for spec in inputs
                          for name in [spec.arg] + [spec.length_args.get(axis) for axis in spec.lengths]]
        self.n_inputs = sum(len(spec.onnx_names) for spec in inputs)
        self.layout = layout

    def call(self, chunk: Sequence[torch.Tensor], states: Sequence[Optional[torch.Tensor]]):
        """The user's step on one chunk, states nested as declared (``None`` passed through)."""
        args: List = []
        kwargs = {}
        for name, tensor in zip(self.arg_names, chunk):
            if name is None:
                args.append(tensor)
            else:
                kwargs[name] = tensor
        args += self.layout.nest(states)
        if self._fn is not None:
            return self._fn(*args, **kwargs)
        if self._method is not None:
            return self._method(self.owner, *args, **kwargs)
        return self.owner(*args, **kwargs)

    def forward(self, *tensors: torch.Tensor):
        chunk, states = tensors[:self.n_inputs], tensors[self.n_inputs:]
        result = self.call(chunk, [s.clone() for s in states])
        return tuple(flatten(result))


def step_name(step: Callable) -> str:
    owner = owner_of(step)
    if isinstance(step, torch.nn.Module):
        return type(step).__name__ + ".forward"
    if owner is not None:
        return f"{type(owner).__name__}.{step.__name__}"
    return getattr(step, "__qualname__", None) or repr(step)


def unfed_parameters(step: Callable, count: int) -> List[str]:
    """The step's required positional parameters that ``count`` positional arguments leave without a value
    (a state the step takes but ``states=`` does not declare), in order; [] when it cannot be told."""
    try:
        params = inspect.signature(step.forward if isinstance(step, torch.nn.Module) else step).parameters
    except (TypeError, ValueError):
        return []
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [p.name for p in positional[count:] if p.default is p.empty]


def accepts_inputs(step: Callable, count: int) -> bool:
    """Whether the step's signature can take ``count`` positional arguments (a readable error otherwise)."""
    try:
        params = inspect.signature(step.forward if isinstance(step, torch.nn.Module) else step).parameters
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return True
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(required) <= count <= len(positional)
