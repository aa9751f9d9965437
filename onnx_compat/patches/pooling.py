"""Adaptive pooling with an output size other than 1 over a dynamic dim.

Adaptive pooling splits a length ``L`` into ``out`` bins, bin ``i`` spanning
``[floor(i·L/out), ceil((i+1)·L/out))``: the bin edges depend on ``L``. The
TorchScript exporter needs ``L`` as a constant ("input size not accessible")
and fails; the dynamo exporter writes the example's bin indices as constants,
so ONNX Runtime fails at a longer input (Gather out of range) or, silently, is
wrong at any other length.

Here the bins are computed in the graph from the runtime length: a ``[out,
L]`` 0/1 membership mask, then a matmul with the mask normalised per bin
(average) or a masked max. Pooling is separable, so 2-D and 3-D pooling is
one pass per pooled axis. An output size of 1 (global pooling) already
exports right and is left to PyTorch, as are ``return_indices=True`` and
integer tensors. ``None`` in the output size keeps that axis as it is: PyTorch
fills it with the input's size, which the TorchScript exporter cannot take as a
constant ("output_size is not constant", issue #47, 5), so an output size with a
``None`` is pooled here axis by axis even where the others are 1 (a mean or a
maximum over that axis).
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

import torch

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call

_NAME = re.compile(r"adaptive_(avg|max)_pool([123])d")


def bin_mask(length, out: int, device=None) -> torch.Tensor:
    """``[out, length]`` bool: which positions each adaptive bin covers (``length`` may be traced)."""
    i = torch.arange(out, device=device)
    start = torch.div(i * length, out, rounding_mode="floor")
    end = torch.div((i + 1) * length + out - 1, out, rounding_mode="floor")
    pos = torch.arange(length, device=device)
    return (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])


def _pool_axis(x: torch.Tensor, axis: int, out: int, kind: str) -> torch.Tensor:
    if out == 1:  # one bin over the whole axis
        return x.mean(axis, keepdim=True) if kind == "avg" else x.amax(axis, keepdim=True)
    last = x.dim() - 1
    moved = x.movedim(axis, last)
    mask = bin_mask(x.shape[axis], out, x.device)
    if kind == "avg":
        weights = mask.to(x.dtype)
        weights = weights / weights.sum(1, keepdim=True)
        pooled = torch.matmul(moved, weights.transpose(0, 1))
    else:
        pooled = moved.unsqueeze(-2).masked_fill(~mask, float("-inf")).amax(-1)
    return pooled.movedim(last, axis)


def adaptive_pool(x: torch.Tensor, output_size: Sequence[Optional[int]], kind: str) -> torch.Tensor:
    """``F.adaptive_{kind}_pool{n}d(x, output_size)`` with bins computed from ``x``'s runtime sizes."""
    n = len(output_size)
    for k, out in enumerate(output_size):
        if out is not None:
            x = _pool_axis(x, x.dim() - n + k, int(out), kind)
    return x


def _sizes(output_size, n: int):
    sizes = (output_size,) * n if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != n or not all(s is None or (isinstance(s, int) and s > 0) for s in sizes):
        return None
    return sizes


def _adaptive_pool(wrapped, instance, args, kwargs):
    kind, n = _NAME.search(getattr(wrapped, "__name__", "")).groups()
    n = int(n)
    b = tensor_call(instance, args, kwargs, ("input", "output_size", "return_indices"), {"return_indices": False})
    if b is None or b["return_indices"] or not b["input"].is_floating_point() or b["input"].dim() < n + 1:
        return wrapped(*args, **kwargs)
    sizes = _sizes(b["output_size"], n)
    if sizes is None or all(s == 1 for s in sizes):
        return wrapped(*args, **kwargs)  # PyTorch's own error, or global pooling, which exports as it is
    if all(s is None for s in sizes):
        return b["input"].clone()  # every axis kept: one element per bin
    return adaptive_pool(b["input"], sizes, kind)


register(Patch(
    name="adaptive_pooling",
    description="adaptive_avg/max_pool1d/2d/3d to sizes other than 1 keep bins right at every input size "
                "(bin edges computed in the graph from the runtime length; both exporters); None in the output size "
                "keeps that axis (TorchScript: 'output_size is not constant')",
    targets=tuple(f"torch.nn.functional:adaptive_{k}_pool{n}d" for k in ("avg", "max") for n in (1, 2, 3))
    + ("torch:adaptive_avg_pool1d",),  # torch.adaptive_max_pool1d returns indices too: not the same function
    wrapper=_adaptive_pool,
    when="export",
))
