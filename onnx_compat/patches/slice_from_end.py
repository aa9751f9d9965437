"""A slice's stop computed from sizes and negative, ``x[..., d // 2:-(d - d // 2)]``, counted from the end.

A centre trim cuts ``d = x.size(-1) - length`` samples from a tensor as
``x[..., d // 2:-(d - d // 2)]`` behind ``if d:`` (demucs' ``center_trim``,
demucs/utils.py:53: Python's ``x[:-0]`` is empty, so eager skips the slice at
``d == 0``). Both exporters record the stop as the expression ``-(d - d // 2)``
and ONNX's ``Slice`` reads a negative end from the end and an end of 0 as 0,
while the ``if d:`` ran once, at the example, where ``d`` was not 0. At every
length where ``d`` is 0 (demucs v2 at a valid length: 1028, 2052, 4100) the
graph's output is then empty where eager returns the whole tensor (measured on
torch 2.13, both exporters; dynamo only records ``Ne(d, 0)`` as an assertion
the ONNX graph does not keep).

While either exporter traces, a slice stop that is computed from traced sizes
(a 0-d tensor from ``x.shape`` under TorchScript, a symbolic size under dynamo)
and is negative at the example is written as ``x.size(dim) + stop``, the
index Python's slicing means by it: the same elements wherever the stop is
negative, and the whole dim where it reaches 0, which is what the branch that
guarded it gives. The start needs nothing (``x[-0:]`` is ``x[0:]`` in both).
Keys with tensors, lists or bools are left to torch.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from .size_math import traced_size

NAME = "slice_stop_from_end"


def _negative_size(stop) -> bool:
    """A stop computed from traced sizes whose value at the example is negative."""
    if isinstance(stop, torch.SymInt):
        hint = stop.node.hint
        return hint is not None and hint < 0
    if traced_size(stop):
        with warnings.catch_warnings():  # the example's value only decides whether to rewrite, nothing is baked
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return int(stop) < 0
    return False


def _consumes(part) -> bool:
    return isinstance(part, (slice, int, torch.SymInt)) and not isinstance(part, bool)


def _stops_from_end(x: torch.Tensor, key) -> Optional[tuple]:
    """``key`` with each negative size stop as ``x.size(dim) + stop``; None when nothing changes."""
    parts = key if isinstance(key, tuple) else (key,)
    if not all(p is None or p is Ellipsis or _consumes(p) for p in parts) or sum(p is Ellipsis for p in parts) > 1:
        return None
    consumed = sum(_consumes(p) for p in parts)
    out, dim, changed = [], 0, False
    for part in parts:
        if part is Ellipsis:
            dim += x.dim() - consumed
        elif isinstance(part, slice) and part.step in (None, 1) and _negative_size(part.stop):
            part, changed = slice(part.start, x.shape[dim] + part.stop, part.step), True
        dim += _consumes(part)
        out.append(part)
    return tuple(out) if changed else None


class _StopsFromEnd(TorchFunctionMode):
    """Rewrites the key of ``Tensor.__getitem__`` calls (the only call it changes)."""

    def __init__(self):
        super().__init__()
        self.rewritten = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and len(args) == 2 and isinstance(args[0], torch.Tensor):
            key = _stops_from_end(args[0], args[1])
            if key is not None:
                self.rewritten += 1
                args = (args[0], key)
        return func(*args, **(kwargs or {}))


def _tracing_with_stops_from_end(wrapped, instance, args, kwargs):
    """The TorchScript exporter's trace (``ONNXTracedModule.forward``) runs under the mode; the dynamo exporter's
    non-strict handler, which turns a ``__getitem__`` with symbolic sizes into ``aten.slice`` calls before any
    mode below it sees them, gets the rewritten key (its ``_override``). Idle when no slice was rewritten."""
    if wrapped.__name__ == "_override":
        return _handler_override(wrapped, args, kwargs)
    mode = _StopsFromEnd() if torch.onnx.is_in_onnx_export() else None
    with mode if mode is not None else contextlib.nullcontext():
        result = wrapped(*args, **kwargs)
    if mode is None or not mode.rewritten:
        idle(NAME)
    return result


def _handler_override(wrapped, args, kwargs):
    func, call, *rest = args
    if func is torch.Tensor.__getitem__ and len(call) == 2 and isinstance(call[0], torch.Tensor):
        key = _stops_from_end(call[0], call[1])
        if key is not None:
            return wrapped(func, (call[0], key), *rest, **kwargs)
    idle(NAME)
    return wrapped(*args, **kwargs)


register(Patch(
    name=NAME,
    description="a slice stop computed from sizes and negative at the example (x[..., d // 2:-(d - d // 2)]) is "
                "x.size(dim) + stop in the graph: the whole dim where it reaches 0, not an empty slice",
    targets=("torch.jit._trace:ONNXTracedModule.forward",
             "torch._export.non_strict_utils:_NonStrictTorchFunctionHandler._override"),
    on_import=("torch._export.non_strict_utils:_NonStrictTorchFunctionHandler._override",),  # not loaded by TS
    wrapper=_tracing_with_stops_from_end,
    when="always",
    aliases=False,
))
