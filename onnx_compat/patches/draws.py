"""Draws of normal and uniform numbers with parameters, written as a standard draw the graph then scales.

A model that makes its own noise is exported with its random nodes and verified with eager's draws fed to
them (``pipeline/draw_inputs.py``). Two forms of a draw with parameters do not export as they are
(measured on torch 2.13):

- ``Tensor.normal_(mean, std)`` and ``torch.normal(mean, std, size)`` of two numbers under TorchScript: the
  exporter writes a standard ``RandomNormalLike`` and scales its float output by double constants, a graph
  ONNX Runtime refuses to load ("Type parameter (T) of Optype (Mul) bound to different types
  (tensor(double) and tensor(float)"). Dynamo writes a ``RandomNormalLike`` with ``mean`` and ``scale``.
- ``Tensor.uniform_(low, high)`` (dither, uniform noise): TorchScript "Exporting the operator
  'aten::uniform' to ONNX ... is not supported"; dynamo fails to convert ``aten.uniform``.

While exporting, these draw standard numbers of the tensor's own dtype (``randn``/``rand``) and scale them
in that dtype: ``mean + std * z``, ``low + (high - low) * u``; the in-place forms write the result into their
tensor (``copy_``), as the model expects. Verification maps eager's draw into the standard node's
distribution, so the scaling itself is checked. A tensor mean or std, a ``generator`` or ``out`` are left
to the exporter.
"""
from __future__ import annotations

import numbers

import torch

from onnx_compat.patches._calls import tensor_call
from onnx_compat.patches.registry import Patch, register


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _normal_in_place(wrapped, instance, args, kwargs):
    bound = tensor_call(instance, args, kwargs, ("self", "mean", "std"), {"mean": 0.0, "std": 1.0})
    if bound is None or not (_number(bound["mean"]) and _number(bound["std"])):
        return wrapped(*args, **kwargs)
    tensor = bound["self"]
    return tensor.copy_(bound["mean"] + bound["std"] * torch.randn_like(tensor))


def _uniform_in_place(wrapped, instance, args, kwargs):
    bound = tensor_call(instance, args, kwargs, ("self", "from", "to"), {"from": 0.0, "to": 1.0})
    if bound is None or not (_number(bound["from"]) and _number(bound["to"])):
        return wrapped(*args, **kwargs)
    tensor, low, high = bound["self"], bound["from"], bound["to"]
    return tensor.copy_(low + (high - low) * torch.rand_like(tensor))


_FACTORY = ("dtype", "layout", "device", "pin_memory", "requires_grad")


def _normal(wrapped, instance, args, kwargs):
    """``torch.normal(mean, std, size, **factory)`` of two numbers; every other form as it is."""
    names = ("mean", "std", "size")
    given = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
    factory = {k: v for k, v in kwargs.items() if k in _FACTORY}
    if len(args) > 3 or set(kwargs) - set(names) - set(factory) or set(given) != set(names) or \
            not (_number(given["mean"]) and _number(given["std"])):
        return wrapped(*args, **kwargs)
    return given["mean"] + given["std"] * torch.randn(given["size"], **factory)


def _normal_draw(wrapped, instance, args, kwargs):
    """One wrapper for both targets, told apart by the function wrapped: ``torch.normal`` also takes a tensor
    mean first, which must never be written into."""
    if getattr(wrapped, "__name__", "") == "normal_":
        return _normal_in_place(wrapped, instance, args, kwargs)
    return _normal(wrapped, instance, args, kwargs)


register(Patch(
    name="normal_draw_scaled",
    description="Tensor.normal_(mean, std) and torch.normal(mean, std, size) of two numbers export under "
                "TorchScript as a standard RandomNormalLike scaled in the tensor's dtype (the exporter's own "
                "scaling in double does not load in ONNX Runtime)",
    targets=("torch:Tensor.normal_", "torch:normal"),
    wrapper=_normal_draw,
    when="torchscript",
))

register(Patch(
    name="uniform_draw_scaled",
    description="Tensor.uniform_(low, high) exports under both exporters as a standard RandomUniformLike "
                "scaled in the tensor's dtype (neither exporter has aten::uniform)",
    targets=("torch:Tensor.uniform_",),
    wrapper=_uniform_in_place,
    when="export",
))
