"""Shape ops whose exported form differs from what the traced model did.

``squeeze()`` without a dim: both exporters (torch 2.13) write an ONNX
``Squeeze`` without axes, which removes every axis that is 1 *at run time*:
at batch 1 the batch axis disappears (and a length-1 input loses its time
axis), although the model, traced at batch 2, kept it. While exporting, a
dim-less squeeze names the axes that are 1 and not dynamic: under dynamo the
static ones; under TorchScript, which cannot tell, those that are 1 in the
example (an example with a dynamic axis of size 1 then fails loudly at other
sizes instead of silently squeezing).

``torch.eye(n, dtype=torch.bool)`` (local-attention masks): the TorchScript
exporter writes an ``EyeLike`` with a bool output, which ONNX Runtime does
not implement ("Could not find an implementation for EyeLike(9)"). Made as
float and cast, which it does.
"""
from __future__ import annotations

import torch

from ..registry import Patch, register
from ._calls import tensor_call
from ._static import static_ints


def _is_static_one(size) -> bool:
    if isinstance(size, getattr(torch, "SymInt", ())):
        return False  # a dynamic dim is never squeezed by a dim-less squeeze while exporting
    return static_ints([size])[0] == 1


def static_ones(x: torch.Tensor):
    """The axes of ``x`` that are 1 and not dynamic."""
    return [axis for axis, size in enumerate(x.shape) if _is_static_one(size)]


def _squeeze(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input",))
    x = None if b is None else b["input"]
    if not isinstance(x, torch.Tensor):
        return wrapped(*args, **kwargs)  # a dim was given, or not a plain tensor (a complex pair squeezes itself)
    for axis in reversed(static_ones(x)):
        x = x.squeeze(axis)
    return x


def _eye(wrapped, instance, args, kwargs):
    if kwargs.get("dtype") is not torch.bool or kwargs.get("out") is not None:
        return wrapped(*args, **kwargs)
    made = dict(kwargs, dtype=torch.float32)
    return wrapped(*args, **made).to(torch.bool)


register(Patch(
    name="squeeze_static",
    description="squeeze() without a dim removes only the axes that are statically 1 while exporting "
                "(the exported Squeeze without axes also drops the batch axis at batch 1)",
    targets=("torch:squeeze", "torch:Tensor.squeeze"),
    wrapper=_squeeze,
    when="export",
))

register(Patch(
    name="eye_bool",
    description="torch.eye(..., dtype=torch.bool) is made as float and cast: ONNX Runtime has no bool EyeLike",
    targets=("torch:eye",),
    wrapper=_eye,
    when="torchscript",
))
