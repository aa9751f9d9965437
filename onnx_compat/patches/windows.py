"""``Tensor.unfold`` (sliding windows) on a dimension whose size is dynamic.

The TorchScript exporter needs the input size as a constant ("ONNX export of
operator Unfold, input size not accessible") and fails when the dim is
dynamic. Framing, local attention and overlap-add code use it on the time
axis. Written as a gather: window ``i`` takes positions ``i * step + [0,
size)``; the number of windows, ``(L - size) // step + 1``, is computed from
the runtime length. The window size and step may be sizes the tracer made
0-d tensors (coqui's UnivNet: ``x.unfold(4, kernel_size, 1)`` with
``kernel_size`` read from ``kernel.shape``; the exporter then fails the same
way, measured on torch 2.13 in the second sweep). The dynamo exporter handles
``unfold`` itself, so this acts under the TorchScript exporter only.
"""
from __future__ import annotations

import torch

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call


def unfold(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    """``x.unfold(dimension, size, step)`` as an index gather."""
    dim = dimension % x.dim()
    length = x.shape[dim]
    count = (length - size) // step + 1
    starts = torch.arange(count, device=x.device) * step
    index = starts[:, None] + torch.arange(size, device=x.device)[None, :]  # [windows, size]
    last = x.dim() - 1  # non-negative axes: the exporter writes a negative one into Transpose's perm
    windows = x.movedim(dim, last)[..., index]  # [..., windows, size]
    return windows.movedim(last, dim)


def _traced_int(value) -> bool:
    """A size the tracer made a 0-d integer tensor (``kernel.shape[3]``), which ``unfold`` takes as an int."""
    return isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point() \
        and not value.is_complex() and value.dtype != torch.bool


def _unfold(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "dimension", "size", "step"))
    if b is None or b["input"].dim() == 0:
        return wrapped(*args, **kwargs)
    x, size, step = b["input"], b["size"], b["step"]
    if not all(isinstance(v, int) or _traced_int(v) for v in (size, step)):
        return wrapped(*args, **kwargs)
    if (isinstance(step, int) and step <= 0) or (isinstance(size, int) and size < 0):
        return wrapped(*args, **kwargs)  # PyTorch's own error
    return unfold(x, b["dimension"], size, step)


register(Patch(
    name="unfold_dynamic",
    description="Tensor.unfold on a dynamic dim exports under TorchScript (an index gather sized at run time)",
    targets=("torch:Tensor.unfold",),
    wrapper=_unfold,
    when="torchscript",
))
