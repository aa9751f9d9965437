"""Which state the step reads as a Python number (``.item()``, ``int()``, ``float()``, ``bool()``, ``.tolist()``).

A number read from a state (Emformer's ``past_length = state[3][0][0].item()``
slicing its caches, a ``if state.any():`` first-chunk test) is frozen by a
trace at its traced value, so the graph is right only at the chunk it was
traced at. During the eager pre-pass a ``TorchFunctionMode`` follows every
tensor made from a state (indexing, arithmetic) and records where one is
turned into a Python value, so an error can name the state and the line.
"""
from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch
from torch.overrides import TorchFunctionMode

_READS = {torch.Tensor.item: ".item()", torch.Tensor.__int__: "int()", torch.Tensor.__float__: "float()",
          torch.Tensor.__bool__: "bool()", torch.Tensor.__index__: "an index", torch.Tensor.tolist: ".tolist()"}


@dataclass(frozen=True)
class PythonRead:
    state: str
    how: str
    where: str  # file:line in the user's code

    def text(self) -> str:
        return f"state {self.state!r} is read as a Python value ({self.how} at {self.where})"


class StateReads(TorchFunctionMode):
    """Follows tensors derived from the given states; records their reads as Python values."""

    def __init__(self, states: Dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.origin: Dict[int, str] = {id(t): name for name, t in states.items() if t is not None}
        self.keep: List[torch.Tensor] = [t for t in states.values() if t is not None]  # ids stay unique meanwhile
        self.reads: List[PythonRead] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sources = [self.origin[id(t)] for t in _tensors((args, kwargs)) if id(t) in self.origin]
        if sources and func in _READS:
            read = PythonRead(sources[0], _READS[func], _caller())
            if read not in self.reads:
                self.reads.append(read)
        result = func(*args, **kwargs)
        if sources:
            for t in _tensors(result):
                self.origin.setdefault(id(t), sources[0])
                self.keep.append(t)
        return result


def _tensors(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _caller() -> str:
    """The innermost frame outside torch and this package: the line that read the value."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep  # with the separator: torchaudio is not torch
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(torch_dir) and "onnx_compat/streaming" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def named(states: Sequence, names: Sequence[str]) -> Dict[str, torch.Tensor]:
    return {n: s for n, s in zip(names, states) if isinstance(s, torch.Tensor)}
