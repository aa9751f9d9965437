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

import torch

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.when import torchscript_exporting


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


def _from_sizes(value, depth: int = 0) -> bool:
    kind = value.node().kind()
    if kind == "prim::NumToTensor":
        return True
    if depth > 8 or kind not in _SIZE_ARITHMETIC:
        return False
    inputs = [v for v in value.node().inputs() if v.node().kind() != "prim::Constant"]
    return bool(inputs) and all(_from_sizes(v, depth + 1) for v in inputs)


_SymInt = getattr(torch, "SymInt", None)


def traced_size(obj) -> bool:
    """A 0-d integer tensor the TorchScript tracer made from sizes (``x.shape[1]``, ``x.shape[1] // 4``)."""
    if not isinstance(obj, torch.Tensor) or obj.dim() != 0 or obj.is_floating_point() or obj.is_complex():
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
