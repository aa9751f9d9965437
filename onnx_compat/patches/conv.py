"""``conv_padding``: string padding in convolutions as explicit pads.

Acts under the TorchScript exporter only. There, ``padding="same"|"valid"``
becomes ``Conv(auto_pad=...)``: deprecated in the ONNX spec, refused by ONNX
Runtime when dilation > 1, and not exportable at all on torch 2.0
(``aten::_convolution_mode``). The dynamo exporter already writes explicit,
asymmetric-capable ``pads``, so it is left alone.

``nn.Conv1d/2d/3d`` call ``F.convNd`` through the module attribute, so wrapping
the functionals covers the modules too. ``padding_mode != "zeros"`` never
reaches here with a string: the module pre-pads and passes 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onnx_compat.patches._padding import as_tuple, f_pad_arg, is_symmetric, same_pads, symmetric_padding
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._static import static_ints

_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _bind(args, kwargs):
    if len(args) > len(_PARAMS):
        return None
    bound = dict(_DEFAULTS)
    bound.update(zip(_PARAMS, args))
    for key, value in kwargs.items():
        if key not in _PARAMS or key in bound and _PARAMS.index(key) < len(args):
            return None  # let the original raise its own error
        bound[key] = value
    if "input" not in bound or "weight" not in bound:
        return None
    return bound


class ZeroPad(torch.autograd.Function):
    """``F.pad(x, pad)`` with zeros and pads known while tracing: one ONNX ``Pad`` with constant ``pads``.
    The traced ``F.pad`` writes ~17 nodes of shape arithmetic around its ``Pad`` (the input's rank and the
    pads assembled at run time), which the exporter's own passes then work through and the cleanup folds
    away: on transformers' LasrEncoder (two even-kernel "same" convs) 28 of the 56 nodes the patches add."""

    @staticmethod
    def forward(ctx, x, rank: int, *pad: int):
        return F.pad(x, list(pad), mode="constant", value=0.0)

    @staticmethod
    def symbolic(g, x, rank, *pad):
        begins, ends = [0] * rank, [0] * rank
        for i in range(len(pad) // 2):  # F.pad's order: the last dim first, (begin, end) each
            begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
        return g.op("Pad", x, g.op("Constant", value_t=torch.tensor(begins + ends, dtype=torch.int64)),
                    mode_s="constant")


def _zero_pad(x, pad):
    """``ZeroPad`` in the TorchScript exporter's trace; ``F.pad`` in a plain ``jit.trace`` (under
    ``patched(during_trace=True)``: its module may be saved, which a Python op cannot be)."""
    if torch.jit.is_tracing() and torch.onnx.is_in_onnx_export():
        return ZeroPad.apply(x, x.dim(), *pad)
    return F.pad(x, pad, mode="constant", value=0.0)


def explicit_conv(wrapped, instance, args, kwargs):
    """Call ``wrapped`` (an ``F.convNd``) with string padding made explicit."""
    b = _bind(args, kwargs)
    if b is None or not isinstance(b["padding"], str):
        return wrapped(*args, **kwargs)
    weight = b["weight"]
    ndim = weight.dim() - 2
    try:
        stride = as_tuple(b["stride"], ndim)
        dilation = as_tuple(b["dilation"], ndim)
    except (TypeError, ValueError):
        return wrapped(*args, **kwargs)
    x, padding = b["input"], b["padding"]
    if padding == "valid":
        padding = 0
    elif padding == "same" and all(s == 1 for s in stride):
        pads = same_pads(static_ints(weight.shape[2:]), dilation, ndim)  # ONNX pads are static, as PyTorch's
        if is_symmetric(pads):
            padding = symmetric_padding(pads)
        else:
            x = _zero_pad(x, f_pad_arg(pads))
            padding = 0
    else:
        return wrapped(*args, **kwargs)  # PyTorch's own error (bad string, strided "same")
    return wrapped(x, weight, b["bias"], stride, padding, dilation, b["groups"])


register(Patch(
    name="conv_padding",
    description='Conv1d/2d/3d and F.conv1d/2d/3d with padding="same"/"valid" export as explicit pads '
                "(no auto_pad; dilation works in ONNX Runtime; torch 2.0 can export them)",
    targets=tuple(f"{mod}:conv{n}d" for n in (1, 2, 3) for mod in ("torch.nn.functional", "torch")),
    wrapper=explicit_conv,
    when="torchscript",
))
