"""Single ops the TorchScript exporter cannot write, written with ops it can.

Measured on torch 2.13 (export facts §3, row 9); the dynamo exporter handles
each of them, so these act under the TorchScript exporter only.

``expm1``
    "Exporting the operator 'aten::expm1' ... is not supported" (HiFi-GAN
    duration predictors). ``exp(x) - 1`` loses every digit for small ``x``, so
    below 1e-2 a 4-term Taylor series is used: both are within float32
    round-off of eager ``expm1``.
``cumsum_small_ints``
    ``cumsum`` of a bool (or int8/uint8/int16) tensor exports, and ONNX Runtime
    refuses to load the graph (ONNX ``CumSum`` has no bool type). PyTorch
    promotes those to int64, so the input is cast to int64 first: same dtype,
    same values.
``vdot_real``
    ``torch.vdot`` (``parametrizations.spectral_norm`` computes sigma with it)
    has no export; for real tensors it is ``(a * b).sum()``.
"""
from __future__ import annotations

import torch

from ..registry import Patch, register
from ._calls import tensor_call

_TAYLOR_BELOW = 1e-2


def expm1(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) - 1``, accurate near 0 too."""
    series = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))))
    return torch.where(x.abs() < _TAYLOR_BELOW, series, torch.exp(x) - 1.0)


def _expm1(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input",))
    if b is None or not isinstance(b["input"], torch.Tensor) or not b["input"].is_floating_point():
        return wrapped(*args, **kwargs)
    return expm1(b["input"])


_PROMOTED = (torch.bool, torch.uint8, torch.int8, torch.int16)


def _cumsum(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
    if b is None or b["dtype"] is not None or b["input"].dtype not in _PROMOTED:
        return wrapped(*args, **kwargs)
    return torch.cumsum(b["input"].to(torch.int64), b["dim"])


def _vdot(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "other"))
    if b is None or b["input"].is_complex() or b["other"].is_complex() or b["input"].dim() != 1:
        return wrapped(*args, **kwargs)
    if b["input"].shape != b["other"].shape or b["input"].dtype != b["other"].dtype:
        return wrapped(*args, **kwargs)  # PyTorch's own error
    return (b["input"] * b["other"]).sum()


register(Patch(
    name="expm1",
    description="torch.expm1 / Tensor.expm1 export under TorchScript (exp(x) - 1, Taylor series near 0)",
    targets=("torch:expm1", "torch:Tensor.expm1"),
    wrapper=_expm1,
    when="torchscript",
))

register(Patch(
    name="cumsum_small_ints",
    description="cumsum of bool/int8/uint8/int16 tensors loads in ONNX Runtime after a TorchScript export "
                "(cast to int64 first, as PyTorch promotes them)",
    targets=("torch:cumsum", "torch:Tensor.cumsum"),
    wrapper=_cumsum,
    when="torchscript",
))

register(Patch(
    name="vdot_real",
    description="torch.vdot of real vectors exports under TorchScript (spectral_norm's sigma)",
    targets=("torch:vdot", "torch:Tensor.vdot"),
    wrapper=_vdot,
    when="torchscript",
))
