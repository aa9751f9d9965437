"""``F.fold`` (overlap-add) over a dynamic number of blocks.

Hand-written ISTFT heads overlap-add their frames with
``F.fold(frames, output_size=(1, (T - 1) * hop + win), kernel_size=(1, win),
stride=(1, hop))`` (and the window envelope the same way); dual-path
separation models overlap-add their chunks with ``F.fold`` too. The
TorchScript exporter's ``col2im`` needs the output size as a constant and
fails with "'NoneType' object is not subscriptable" as soon as it depends on
a dynamic dim (measured on torch 2.13; the dynamo exporter writes ``col2im``
itself).

``fold`` is a transposed convolution with one-hot kernels (output channel
``c`` of group ``c`` takes kernel offset ``k`` from input channel ``c·K +
k``), so overlapping blocks add up where they land. The block grid is read
from the runtime sizes and the output cropped to ``output_size``: no size is
baked. ``F.unfold`` exports under both exporters as it is (measured on torch
2.13, dynamic height and width, padding and dilation), so it is left alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onnx_compat.patches.registry import Patch, register
from ._static import static_ints

_PARAMS = ("input", "output_size", "kernel_size", "dilation", "padding", "stride")


def _pair(value):
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def one_hot_kernels(channels: int, kh: int, kw: int, like: torch.Tensor) -> torch.Tensor:
    """``[channels·kh·kw, 1, kh, kw]``: kernel ``c·K + k`` is 1 at offset ``k`` (row-major), 0 elsewhere."""
    k = kh * kw
    eye = torch.eye(k, dtype=like.dtype, device=like.device).reshape(k, 1, kh, kw)
    return eye.repeat(channels, 1, 1, 1)


def _blocks(size, pad: int, dil: int, kernel: int, stride: int):
    return (size + 2 * pad - dil * (kernel - 1) - 1) // stride + 1


def fold(x, output_size, kernel, dilation, padding, stride) -> torch.Tensor:
    """``F.fold`` as a grouped ``conv_transpose2d`` of the block grid, cropped to ``output_size``."""
    batched = x.dim() == 3
    x = x if batched else x.unsqueeze(0)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    height, width = output_size
    channels = static_ints(x.shape[1:2])[0] // (kh * kw)
    rows = _blocks(height, ph, dh, kh, sh)
    cols = _blocks(width, pw, dw, kw, sw)
    if isinstance(rows, int):
        grid = x.reshape(x.shape[0], x.shape[1], rows, -1)
    elif isinstance(cols, int):
        grid = x.reshape(x.shape[0], x.shape[1], -1, cols)
    else:
        grid = x.reshape(x.shape[0], x.shape[1], rows, cols)
    out = F.conv_transpose2d(grid, one_hot_kernels(channels, kh, kw, x), stride=(sh, sw),
                             dilation=(dh, dw), groups=channels)
    out = F.pad(out, (0, sw, 0, sh))  # positions no block reaches (at most stride - 1 - padding of them)
    out = out[:, :, ph:ph + height, pw:pw + width]
    return out if batched else out.squeeze(0)


def _bind(args, kwargs, params):
    if len(args) > len(params) or any(k not in params or params.index(k) < len(args) for k in kwargs):
        return None
    bound = {"dilation": 1, "padding": 0, "stride": 1}
    bound.update(zip(params, args))
    bound.update(kwargs)
    return bound if all(p in bound for p in params) else None


def _geometry(b):
    """``(kernel, dilation, padding, stride)`` as int pairs, or None (PyTorch's own checks then run)."""
    parts = tuple(_pair(b[k]) for k in ("kernel_size", "dilation", "padding", "stride"))
    if any(p is None for p in parts) or min(parts[0] + parts[1] + parts[3]) <= 0 or min(parts[2]) < 0:
        return None
    return parts


def _fold(wrapped, instance, args, kwargs):
    b = _bind(args, kwargs, _PARAMS)
    geometry = None if b is None else _geometry(b)
    x = None if b is None else b["input"]
    size = None if b is None else b["output_size"]
    size = (size, size) if isinstance(size, int) else size
    if geometry is None or not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.is_complex() \
            or not isinstance(size, (list, tuple)) or len(size) != 2 or not _fits(x, size, geometry):
        return wrapped(*args, **kwargs)  # PyTorch's own error
    return fold(x, tuple(size), *geometry)


def _fits(x, size, geometry) -> bool:
    """The example's blocks tile ``output_size`` as PyTorch requires (else its error, not a cropped guess)."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = geometry
    try:
        channels_k, blocks = static_ints(x.shape[-2:])
        height, width = static_ints(size)
        rows, cols = _blocks(height, ph, dh, kh, sh), _blocks(width, pw, dw, kw, sw)
        return channels_k % (kh * kw) == 0 and rows > 0 and cols > 0 and rows * cols == blocks
    except (TypeError, RuntimeError):  # a size that has no value here (dynamo's symbolic sizes): trust it
        return True


register(Patch(
    name="fold_dynamic",
    description="F.fold (overlap-add of frames or chunks) with an output size computed from a dynamic dim "
                "exports under TorchScript (a grouped one-hot conv_transpose2d, cropped at run time)",
    targets=("torch.nn.functional:fold",),
    wrapper=_fold,
    when="torchscript",
))
