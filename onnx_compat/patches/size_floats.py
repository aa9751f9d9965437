"""``float()`` of a traced size, kept in the graph while an export traces (issue #47, round three).

kraken's VGSL reshape rescales the sequence lengths by the width before it over the width after it:
``seq_len = (seq_len * (float(initial_len) / o.shape[3])).int()`` (kraken/lib/layers.py:320). Python's
``float()`` must return a float, so (measured on torch 2.13):

- TorchScript: ``float()`` of the traced size ``x.shape[3]`` (a 0-d tensor) records the example's width as a
  constant; at another width the lengths exceed the sequence ("Invalid value/s in sequence_lens");
- dynamo: a ``SymInt`` has no ``__float__``, so ``float()`` goes through ``SymInt.__index__``, which guards the
  size to the example's (``Eq((w//4), 24)``: the dim specialised);
- dynamo's strict retry makes a symbolic float of it, which the ONNX translation of ``mul`` by a scalar cannot
  take (torchlib ``aten_mul_scalar``).

While an export traces, the model's own called ``float`` (redirected as its ``int``/``len``/``max``/``min``
calls are, ``int_calls.py``) gives a size as a 0-d tensor of the default float dtype computed in the graph:
under TorchScript a traced size (a 0-d tensor computed from ``x.shape`` by arithmetic, a true division of sizes
too, or a batch/padded size the ``len``/``max`` stand-ins gave), under dynamo a symbolic size (``SymInt`` or
``SymFloat`` with a free symbol; also the 0-d maximum of a declared lengths input read as the padded dim). A
tensor times it, or divided by it, is a graph op under both exporters. The default float dtype (float32) keeps
eager's result dtype: a Python float does not promote an integer or float32 tensor past it, and a float64 0-d
tensor would. Anything else is Python's ``float()``, so numbers the model fixes stay Python floats.
"""
from __future__ import annotations

import torch

from .size_math import _from_sizes
from .when import any_exporting, dynamo_exporting, torchscript_exporting

_SYMBOLIC = tuple(t for t in (getattr(torch, "SymInt", None), getattr(torch, "SymFloat", None)) if t is not None)
_kept = [0]  # float() calls answered with a size in the graph (int_calls reads it for ``patch.idle``)


def float_of(*args, **kwargs):
    """``float(value)`` for the model's code: a traced or symbolic size as a 0-d tensor of the default float
    dtype in the graph; Python's ``float`` for anything else."""
    size = _size(args[0]) if len(args) == 1 and not kwargs else None
    if size is None:
        return float(*args, **kwargs)
    _kept[0] += 1
    dtype = torch.get_default_dtype()
    if isinstance(size, torch.Tensor):
        return size.to(dtype)
    return torch.full((), size, dtype=dtype)


def kept() -> int:
    """How many ``float()`` calls ``float_of`` kept in the graph so far."""
    return _kept[0]


def _size(value):
    """The size ``value`` is (a traced 0-d tensor, or a ``SymInt``/``SymFloat``), or None when it is none."""
    if isinstance(value, torch.Tensor):
        return _tensor_size(value)
    if _SYMBOLIC and isinstance(value, _SYMBOLIC) and dynamo_exporting():
        expr = getattr(value.node, "expr", None)
        return value if expr is not None and expr.free_symbols else None
    return None


def _tensor_size(value: torch.Tensor):
    if value.dim() != 0 or value.is_complex() or value.dtype == torch.bool or not any_exporting():
        return None
    from .lengths import kept_size, padded_size_of
    known = padded_size_of(value)  # the maximum of declared lengths read as the padded dim (either exporter)
    if known is None:
        known = kept_size(value)  # a batch size len_of gave
    if known is not None:
        return known
    return value if torchscript_exporting() and _traced_from_sizes(value) else None


def _traced_from_sizes(value: torch.Tensor) -> bool:
    try:
        traced = torch._C._get_value_trace(value)
    except RuntimeError:  # not traced (a tensor from outside the trace)
        return False
    return traced is not None and _from_sizes(traced)
