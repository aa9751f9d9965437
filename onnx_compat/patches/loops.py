"""Python loops whose trip count is a dynamic size, met while the dynamo exporter traces.

A length regulator loops over the batch (``for h, d in zip(x, durations)``
or ``for i in range(x.shape[0])``); a codec loops over chunk offsets
``range(0, length - step, stride)``. Neither exporter writes a Python loop as
a graph loop: the TorchScript exporter unrolls it at the example's count
(silently: no size of its trace is known to be dynamic), the dynamo exporter
specialises the dim, so the exported model refuses any other batch or length
("Got invalid dimensions for input") or fails with ``DimSpecialized`` far
from the loop (measured on torch 2.13).

While the dynamo exporter traces, iterating over a tensor whose first dim is
dynamic, or ``range()`` / ``int`` use of a dynamic size in the model's own
code, raises one error naming the source line and the dim, so
the fix (tensor ops over the whole dim, or a static size)
is clear. Torch's own code is left alone.
"""
from __future__ import annotations

import sys

import torch

from ..registry import Patch, register
from .recurrent import _refuse

_SymInt = getattr(torch, "SymInt", None)


def _model_frame():
    """The model code's frame that made the call, or None when torch or a patch did."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__") == __name__ or frame.f_code is Patch.gate.__code__):
        frame = frame.f_back
    if frame is None:
        return None
    module = frame.f_globals.get("__name__", "")
    return None if module.split(".")[0] == "torch" or module.startswith(__package__) else frame


def _is_dynamic(size) -> bool:
    if _SymInt is None or not isinstance(size, _SymInt):
        return False
    return bool(getattr(size.node, "expr", None) is not None and size.node.expr.free_symbols)


def _refuse_at(frame, what: str, size) -> None:
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    _refuse(f"{where}: {what} the dynamic size {size.node.expr}: a Python loop or list sized by it is unrolled "
            f"at the example's value, so the exported graph would hold only that many steps. Write it with "
            f"tensor ops over the whole dim (or make the dim static)")


def _iter(wrapped, instance, args, kwargs):
    frame = _model_frame()
    if frame is not None and instance.dim() > 0 and _is_dynamic(instance.shape[0]):
        _refuse_at(frame, f"iterating over dim 0 of a tensor of shape {tuple(instance.shape)} loops", instance.shape[0])
    return wrapped(*args, **kwargs)


def _index(wrapped, instance, args, kwargs):
    frame = _model_frame()
    if frame is not None and _is_dynamic(instance):
        _refuse_at(frame, "range(), a list length or an index takes", instance)
    return wrapped(*args, **kwargs)


def _loop_use(wrapped, instance, args, kwargs):
    return (_iter if isinstance(instance, torch.Tensor) else _index)(wrapped, instance, args, kwargs)


register(Patch(
    name="dynamic_loops",
    description="a Python loop over a dynamic dim (iterating a tensor, range(size)) in model code raises one "
                "error naming the source line and the dim under dynamo, instead of a specialised graph",
    targets=("torch:Tensor.__iter__",) + (("torch:SymInt.__index__",) if _SymInt is not None else ()),
    wrapper=_loop_use,
    when="dynamo",
    aliases=False,
    requires=("onnx_translations",),
))
