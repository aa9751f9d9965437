"""``math.ceil`` / ``math.floor`` of a size traced by the TorchScript exporter.

Models pad to a multiple of the hop with ``n = math.ceil(length / hop)`` and
crop resampled signals to ``math.floor(new_sr * length / old_sr)``. The
TorchScript exporter traces ``length = x.shape[-1]`` as a 0-d tensor and
``math`` turns it into a Python float: the example's size is baked in and
the graph is wrong at every other length (measured on torch 2.13; dynamo
keeps ``math.ceil`` of its symbolic sizes exact by itself). While the
TorchScript exporter traces, ``math.ceil``/``math.floor`` of a 0-d tensor
give a 0-d int64 tensor computed in the graph, so the size stays symbolic.
Sizes are exact in the float32 quotient up to 2**24.

``int(...)``, ``round(...)``, ``max``/``min`` and comparisons of such a size
still turn it into a Python number (Python requires ``int()`` to return an
int): those forms stay baked; see docs/patterns.md.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.when import any_exporting, torchscript_exporting


def _rounding(wrapped, instance, args, kwargs):
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() != 0 \
            or args[0].is_complex():
        return wrapped(*args, **kwargs)
    rounder = torch.ceil if wrapped.__name__ == "ceil" else torch.floor
    value = args[0]
    if not value.is_floating_point():
        return value.to(torch.int64)
    return rounder(value).to(torch.int64)


register(Patch(
    name="size_rounding",
    description="math.ceil / math.floor of a traced size stay in the graph under TorchScript "
                "(pad-to-a-multiple and resampled lengths were baked at the example's size)",
    targets=("math:ceil", "math:floor"),
    wrapper=_rounding,
    when="torchscript",
))


# --- a traced size is no tensor of the model's (issue #39, pattern 5) -------------------------------
# Helpers take a length as an int or a batch of lengths: ``if torch.is_tensor(seq_len): mask from
# seq_len[:, None] else: all valid``. Traced by TorchScript, ``seq_len = x.shape[1]`` is a 0-d tensor, so the
# lengths branch runs and fails ("IndexError: too many indices for tensor of dimension 0", measured on torch
# 2.13), where eager takes the int branch. While TorchScript traces, ``torch.is_tensor`` of a 0-d value
# computed only from traced sizes (``prim::NumToTensor``, through integer arithmetic) answers False, as it
# would in eager; everything else is answered by torch.

_SIZE_ARITHMETIC = {"aten::add", "aten::sub", "aten::mul", "aten::floor_divide", "aten::div", "aten::remainder",
                    "aten::neg", "aten::floordiv", "aten::ceil", "aten::floor", "aten::to", "aten::Int",
                    "aten::rsub", "aten::mul_", "aten::add_", "aten::sub_"}


def _from_sizes(value, seen: Optional[Dict[int, bool]] = None) -> bool:
    """Computed from ``prim::NumToTensor`` (a traced size) by integer arithmetic alone. No depth limit: demucs'
    ``valid_length`` takes a size through ~20 steps of ceil/max/multiply per layer; each value is looked at once."""
    seen = {} if seen is None else seen
    key = value.unique()
    if key not in seen:
        kind = value.node().kind()
        seen[key] = False  # a cycle cannot happen in a trace; this only stops a second look
        inputs = [v for v in value.node().inputs() if v.node().kind() != "prim::Constant"]
        seen[key] = kind == "prim::NumToTensor" or (
            kind in _SIZE_ARITHMETIC and bool(inputs) and all(_from_sizes(v, seen) for v in inputs))
    return seen[key]


_SymInt = getattr(torch, "SymInt", None)


def symbolic_size(value) -> bool:
    """A size dynamo follows: a ``SymInt`` whose expression holds a free symbol (not one made the example's number)."""
    expr = getattr(value.node, "expr", None) if _SymInt is not None and isinstance(value, _SymInt) else None
    return expr is not None and bool(expr.free_symbols)


def traced_size(obj) -> bool:
    """A 0-d integer tensor the TorchScript tracer made from sizes (``x.shape[1]``, ``x.shape[1] // 4``)."""
    if not isinstance(obj, torch.Tensor) or obj.dim() != 0 or obj.is_floating_point() or obj.is_complex():
        return False
    if not torch._C._is_tracing():  # _get_value_trace outside a TorchScript trace crashes the process (dynamo)
        return False
    try:
        value = torch._C._get_value_trace(obj)
    except RuntimeError:  # not traced (a tensor from outside the trace)
        return False
    return value is not None and _from_sizes(value)


#
# Answered False, the size then meets what the model does with an int. Arithmetic and comparisons work on the
# 0-d tensor, ``divmod`` does not (pesto's ``if torch.is_tensor(num_bins): num_bins = num_bins.item()``
# then ``bps, r = divmod(num_bins, 128)``: "unsupported operand type(s) for divmod(): 'Tensor' and 'int'",
# measured on torch 2.13 in the second sweep): while TorchScript traces, ``divmod`` with a traced size is
# ``(a // b, a % b)``, Python's floor division and remainder, which torch's ``//`` and ``%`` compute alike,
# kept in the graph. The dynamo exporter's symbolic sizes lack it too ("unsupported operand type(s) for
# divmod(): 'SymInt' and 'int'"): the same there.


def _size(value) -> bool:
    return traced_size(value) or (_SymInt is not None and isinstance(value, _SymInt))


def _sizes(args) -> bool:
    return len(args) == 2 and any(_size(a) for a in args) and all(_size(a) or isinstance(a, int) for a in args)


def _divmod(wrapped, instance, args, kwargs):
    if not kwargs and _sizes(args):
        a, b = args
        return a // b, a % b
    return wrapped(*args, **kwargs)


def _size_as_int(wrapped, instance, args, kwargs):
    """``torch.is_tensor`` is called all over torch while dynamo traces: a call that leaves the answer to
    torch does not count as the patch acting (``patch.idle``)."""
    if wrapped.__name__ == "divmod":
        changed = not kwargs and _sizes(args)
        answer = _divmod(wrapped, instance, args, kwargs)
    else:
        changed = len(args) == 1 and not kwargs and torchscript_exporting() and traced_size(args[0])
        answer = False if changed else wrapped(*args, **kwargs)
    if not changed:
        idle("traced_size_is_int")
    return answer


register(Patch(
    name="traced_size_is_int",
    description="a size traced by TorchScript (x.shape[1]) acts as the int it is in eager: torch.is_tensor of it "
                "answers False (an int-or-lengths helper takes its int branch); divmod of it (or of dynamo's symbolic "
                "size) works",
    targets=("torch:is_tensor", "builtins:divmod"),
    wrapper=_size_as_int,
    when="export",  # is_tensor: only a TorchScript trace has traced sizes; divmod: both exporters' sizes
    aliases=False,
))


# --- a size to a negative power (round five: Mega's Laplace attention scales by ``seq_len ** -1``) -------------
# Python's ``T ** -1`` of an int is a float. Traced by TorchScript, ``T = x.shape[-2]`` is a 0-d int64 tensor, and
# torch refuses an integer tensor to a negative integer power ("Integers to negative integer powers are not
# allowed", measured on torch 2.13): the export stopped. While TorchScript traces, a traced size to a negative int
# power is taken in the default float dtype, as Python takes it in floats (dynamo's symbolic sizes do so already).


def _size_power(wrapped, instance, args, kwargs):
    exponent = args[0] if args else kwargs.get("other", kwargs.get("exponent"))
    if type(exponent) is int and exponent < 0 and traced_size(instance):
        return instance.to(torch.get_default_dtype()) ** exponent  # a float tensor: this wrapper passes it on
    return wrapped(*args, **kwargs)


register(Patch(
    name="size_negative_powers",
    description="a size traced by TorchScript to a negative int power is a float, as Python's T ** -1 is (torch "
                "refuses an integer tensor to a negative integer power)",
    targets=("torch:Tensor.__pow__",),
    wrapper=_size_power,
    when="torchscript",
    aliases=False,
))


# --- int() and isinstance() of a size, for the model-code stand-ins of int_calls.py (issue #47, 9) ---------------
# demucs v2's ``valid_length`` ends in ``return int(length)`` (demucs/demucs.py:397) and torchaudio's HDemucs takes
# ``le = int(math.ceil(x.shape[-1] / hl))`` (_hdemucs.py:479), ``int(x.shape[-1])`` (:923, :943): Python's
# ``int()`` must return an int, so the TorchScript exporter bakes the example's size and the dynamo exporter
# specialises the dim (``Eq(16*Max(1, ...) + 20, 4100) [guard added] (demucs/demucs.py:397)``, measured on torch
# 2.13). ``int()`` of a size is already that size: while either exporter traces, the model's called ``int`` gives
# a traced size (a 0-d tensor computed from ``x.shape``) or a symbolic size back unchanged. demucs' ``center_trim``
# takes its reference as a tensor or a length (``if isinstance(reference, torch.Tensor): reference.size(-1)``,
# demucs/utils.py:46): under TorchScript a traced length is a 0-d tensor, so it took the tensor branch ("Dimension
# specified as -1 but tensor has no dimensions"); ``isinstance`` of a traced size and ``torch.Tensor`` answers
# False, as ``torch.is_tensor`` does above.


def int_of_size(value):
    """``int(value)`` for the model's code while an export traces: a traced or symbolic size itself, else None
    (then Python's ``int`` answers)."""
    if torchscript_exporting() and traced_size(value):
        return value
    if _SymInt is not None and isinstance(value, _SymInt) and any_exporting():
        return value
    return None


def _names_tensor(classinfo) -> bool:
    if isinstance(classinfo, tuple):
        return any(_names_tensor(c) for c in classinfo)
    return isinstance(classinfo, type) and issubclass(torch.Tensor, classinfo) and classinfo is not object


def _names_int(classinfo) -> bool:
    if isinstance(classinfo, tuple):
        return any(_names_int(c) for c in classinfo)
    return isinstance(classinfo, type) and issubclass(int, classinfo)


def isinstance_of(value, classinfo) -> bool:
    """``isinstance`` for the model's code: a size the TorchScript exporter traced as a 0-d tensor is an int, as
    in eager (not a ``torch.Tensor``); ``isinstance`` otherwise."""
    if torchscript_exporting() and (_names_tensor(classinfo) or _names_int(classinfo)) and traced_size(value):
        return _names_int(classinfo)  # what eager's int answers
    return isinstance(value, classinfo)
