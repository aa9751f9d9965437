"""``F.interpolate(..., antialias=True)``: the weights computed in the graph from the runtime size.

PyTorch's antialiased bilinear/bicubic resize (PIL's algorithm) gives output
pixel ``i`` of an axis the weights ``filter((j - center_i + 0.5) · invscale)``
over input pixels ``j``, normalised to sum 1, where ``center_i = scale · (i +
0.5)``, ``scale`` is ``in/out`` (or ``1/scale_factor`` when a scale factor is
given and not recomputed) and ``invscale = 1/scale`` when downscaling, else 1.
The filter is the triangle (bilinear) or Keys' cubic with a = -0.5 (bicubic);
it is 0 outside PyTorch's window, so a dense ``[out, in]`` weight matrix per
axis reproduces it, and the resize is two matmuls (it is separable). An axis
whose output size equals its input size is copied, as PyTorch does.

The TorchScript exporter cannot write ``_upsample_bilinear2d_aa`` at all. The
dynamo exporter writes ONNX ``Resize(antialias=1)`` with output *sizes*, whose
scale is ``in/out``: with a ``scale_factor`` that does not divide the input
size, every value is silently wrong (max abs err 0.6-1.6 measured). Under
dynamo the patch therefore takes over when a ``scale_factor`` is used and
leaves ``size=`` to the native Resize; under TorchScript it always takes over.
``align_corners=True`` and integer images are left to PyTorch.
"""
from __future__ import annotations

import math

import torch



from onnx_compat.patches import when
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call

_PARAMS = ("input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias")
_DEFAULTS = {"size": None, "scale_factor": None, "mode": "nearest", "align_corners": None,
             "recompute_scale_factor": None, "antialias": False}
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}


def _filter(arg: torch.Tensor, mode: str) -> torch.Tensor:
    t = arg.abs()
    if mode == "bilinear":
        return (1.0 - t).clamp(min=0.0)
    a = -0.5
    near = ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0
    far = ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a
    return torch.where(t < 1.0, near, torch.where(t < 2.0, far, torch.zeros_like(t)))


def _floor_int(value):
    """floor of a size expression that may be an int, a SymFloat (dynamo) or a 0-dim tensor (TorchScript)."""
    if isinstance(value, torch.Tensor):
        return value.floor().long()
    return math.floor(value)


def aa_weights(length, out, scale, mode: str, dtype=torch.float32, device=None) -> torch.Tensor:
    """``[out, length]`` antialias weights of one axis; ``scale`` maps output to input coordinates."""
    i = torch.arange(out, device=device).to(dtype)
    j = torch.arange(length, device=device).to(dtype)
    # a 0-dim tensor: a SymFloat scale (dynamo) stays symbolic through a multiplication, not through as_tensor
    scale = scale.to(dtype) if isinstance(scale, torch.Tensor) else torch.ones((), dtype=dtype, device=device) * scale
    invscale = torch.where(scale >= 1.0, 1.0 / scale, torch.ones_like(scale))
    center = scale * (i + 0.5)
    weights = _filter((j[None, :] - center[:, None] + 0.5) * invscale, mode)
    total = weights.sum(1, keepdim=True)
    weights = weights / torch.where(total == 0, torch.ones_like(total), total)
    # PyTorch copies an axis whose output size equals its input size, whatever the scale;
    # compared as tensors, so that a dynamic size is not specialised
    one = torch.ones((), dtype=torch.int64, device=device)
    identity = (i[:, None] == j[None, :]).to(dtype)
    return torch.where(one * out == one * length, identity, weights)


def _axis_plan(length, size, factor, recompute):
    """(output size, scale) of one axis, as PyTorch computes them."""
    if size is not None:
        return size, length / size if isinstance(length, torch.Tensor) else length / size
    out = _floor_int(length.double() * factor if isinstance(length, torch.Tensor) else length * factor)
    if recompute:
        return out, (length.double() / out) if isinstance(length, torch.Tensor) else length / out
    return out, 1.0 / factor


def antialias_resize(x, size, scale_factor, mode: str, recompute: bool) -> torch.Tensor:
    """``F.interpolate(x, size, scale_factor, mode, antialias=True)`` for 4-D ``x`` as two matmuls."""
    sizes = (None, None) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
    factors = (None, None) if scale_factor is None else \
        ((scale_factor,) * 2 if isinstance(scale_factor, (int, float)) else tuple(scale_factor))
    (out_h, scale_h), (out_w, scale_w) = (_axis_plan(x.shape[2 + k], sizes[k], factors[k], recompute)
                                          for k in range(2))
    w_h = aa_weights(x.shape[2], out_h, scale_h, mode, x.dtype, x.device)
    w_w = aa_weights(x.shape[3], out_w, scale_w, mode, x.dtype, x.device)
    return torch.matmul(w_h, torch.matmul(x, w_w.transpose(0, 1)))


def _interpolate(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, _PARAMS, _DEFAULTS)
    if b is None or not b["antialias"] or b["mode"] not in _SUPPORT or b["align_corners"]:
        return wrapped(*args, **kwargs)
    x = b["input"]
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        return wrapped(*args, **kwargs)
    if (b["size"] is None) == (b["scale_factor"] is None):
        return wrapped(*args, **kwargs)  # PyTorch's own error
    if when.dynamo_exporting() and b["scale_factor"] is None:
        return wrapped(*args, **kwargs)  # Resize with sizes is right here
    return antialias_resize(x, b["size"], b["scale_factor"], b["mode"], bool(b["recompute_scale_factor"]))


register(Patch(
    name="antialias_resize",
    description="F.interpolate(antialias=True) bilinear/bicubic exports under TorchScript and is right under "
                "dynamo with scale_factor (weights computed in the graph from the runtime size)",
    targets=("torch.nn.functional:interpolate",),
    wrapper=_interpolate,
    when="export",
))
