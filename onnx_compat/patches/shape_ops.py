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

``torch.movedim(x, -1, 2)`` (transformers' Gemma 3n audio encoder moves the unfolded frame axis so): the
TorchScript exporter's ``movedim`` puts a negative source into the ``Transpose``'s perm as it is (torch 2.13:
``perm=[0, 2, 1, 3, -1]``, which ONNX Runtime refuses), and its peephole pass, composing that ``Transpose`` with
the next, reads past the perm (``[0, 3, 1, 49, 2]`` there). Source and destination are given to it counted from
the front.

``as_strided`` framing (``x.as_strided((B, frames, win), (T, hop, 1))``):
the TorchScript exporter needs every size and stride as a constant ("Failed
to export a node ... because it is not constant"). For a tensor that owns its
storage contiguously (what ``as_strided`` framing is used on), the view is a
gather from the flattened tensor at ``offset + Σ arange(size_k)·stride_k``,
computed from the runtime sizes. Strides read with ``x.stride(j)`` (julius's
framing: ``[padded.stride(0), hop, 1]``) are the example's ints to the
TorchScript tracer and ``sym_stride`` nodes, which have no ONNX translation,
to dynamo: for a contiguous tensor they are written as the product of the
sizes after ``j``, under both exporters.
"""
from __future__ import annotations

import sys

import torch

from onnx_compat.patches.registry import Patch, register
from ._calls import tensor_call
from .when import dynamo_exporting, torchscript_exporting
from ._static import static_ints
from .size_math import symbolic_size


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
        return _squeeze_dim(wrapped, instance, args, kwargs)  # a dim was given, or not a plain tensor
    if wrapped.__name__ == "squeeze_":
        return wrapped(*args, **kwargs)
    for axis in reversed(static_ones(x)):
        x = x.squeeze(axis)
    return x


def _squeeze_dim(wrapped, instance, args, kwargs):
    """``squeeze(dim)`` of a dim that is statically not 1 is a no-op in torch; the dynamo exporter writes a
    ``Squeeze`` of that axis, which ONNX refuses to load (coqui's ResNet speaker encoder ``x.squeeze_(1)`` on
    ``[B, 64, T]``: "Dimension of input 1 must be 1 instead of 64", measured on torch 2.13 in the second
    sweep). While dynamo exports, such a call returns the tensor as it is (``squeeze_``: itself, as torch)."""
    b = tensor_call(instance, args, kwargs, ("input", "dim"))
    x = None if b is None else b["input"]
    if not (isinstance(x, torch.Tensor) and isinstance(b["dim"], int) and dynamo_exporting()) or x.dim() == 0:
        return wrapped(*args, **kwargs)
    size = x.shape[b["dim"]]
    if type(size) is not int or size == 1:
        return wrapped(*args, **kwargs)
    return x if wrapped.__name__ == "squeeze_" else x.view(x.shape)


def _eye(wrapped, instance, args, kwargs):
    if kwargs.get("dtype") is not torch.bool or kwargs.get("out") is not None:
        return wrapped(*args, **kwargs)
    made = dict(kwargs, dtype=torch.float32)
    return wrapped(*args, **made).to(torch.bool)


def _from_front(dims, rank: int):
    """``dims`` (an int or a sequence of them) with each negative one counted from the front."""
    if isinstance(dims, int):
        return dims % rank if -rank <= dims < 0 else dims
    if isinstance(dims, (list, tuple)) and all(isinstance(d, int) for d in dims):
        return type(dims)(_from_front(d, rank) for d in dims)
    return dims


def _movedim(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "source", "destination"))
    if b is None or not isinstance(b["input"], torch.Tensor):
        return wrapped(*args, **kwargs)
    rank = b["input"].dim()
    return wrapped(b["input"], _from_front(b["source"], rank), _from_front(b["destination"], rank)) \
        if instance is None else wrapped(_from_front(b["source"], rank), _from_front(b["destination"], rank))


def as_strided(x: torch.Tensor, size, stride, storage_offset=None) -> torch.Tensor:
    """``x.as_strided(size, stride, storage_offset)`` of a contiguous tensor that owns its storage, as a gather."""
    index = torch.zeros((), dtype=torch.int64, device=x.device) + (storage_offset or 0)
    for axis, (count, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = -1
        index = index + (torch.arange(count, device=x.device) * step).reshape(shape)
    return x.reshape(-1)[index]


def _owns_storage(x: torch.Tensor) -> bool:
    return x.is_contiguous() and x.storage_offset() == 0 \
        and x.untyped_storage().nbytes() == x.numel() * x.element_size()


def _same_size(a, b) -> bool:
    """Equal strides: as ints, or as the same symbolic expression (no guard is added)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    expr_a, expr_b = (getattr(getattr(v, "node", None), "expr", None) for v in (a, b))
    return expr_a is not None and expr_a == expr_b


def runtime_strides(x: torch.Tensor, stride):
    """``stride`` with each entry equal to ``x.stride(j)`` (> 1) written as the product of the sizes after
    ``j``: the same number for a contiguous ``x``, but computed from the runtime sizes. TorchScript
    reads ``x.stride(0)`` as the example's int; dynamo keeps it as ``sym_stride``, which has no ONNX
    translation ("No ONNX function found for aten.sym_stride.int")."""
    own = x.stride()
    out = []
    for s in stride:
        if not (torchscript_exporting() or symbolic_size(s)):
            out.append(s)  # dynamo: only a symbolic stride becomes a sym_stride node
            continue
        j = next((j for j, t in enumerate(own) if not (isinstance(t, int) and t <= 1) and _same_size(s, t)), None)
        out.append(s if j is None else _product(x.shape[j + 1:]))
    return out


def _product(sizes):
    total = 1
    for size in sizes:
        total = total * size
    return total


def _called_by_model() -> bool:
    """torch's own decompositions call ``as_strided`` with strides of their own making: left alone."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__") == __name__ or frame.f_code is Patch.gate.__code__):
        frame = frame.f_back
    module = "" if frame is None else frame.f_globals.get("__name__", "")
    return frame is not None and module.split(".")[0] != "torch" and not module.startswith(__package__)


def _as_strided(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "size", "stride", "storage_offset"), {"storage_offset": None})
    x = None if b is None else b["input"]
    if not _called_by_model() or not isinstance(x, torch.Tensor) or not isinstance(b["size"], (list, tuple)) \
            or not isinstance(b["stride"], (list, tuple)) or len(b["size"]) != len(b["stride"]) \
            or not b["size"] or not x.is_contiguous():
        return wrapped(*args, **kwargs)
    return strided_view(x, b["size"], b["stride"], b["storage_offset"])


def strided_view(x: torch.Tensor, size, stride, storage_offset=None) -> torch.Tensor:
    """The model's ``x.as_strided(size, stride, storage_offset)`` as it exports: strides read from ``x`` follow
    the runtime sizes; under TorchScript a gather where ``x`` owns its storage (a view of a view's storage is
    not the tensor's values: torch's own call, which needs constants)."""
    aten = torch.ops.aten.as_strided  # aten's: not this patch again
    if not x.is_contiguous():
        return aten(x, size, stride, storage_offset)
    runtime = runtime_strides(x, stride)
    if not torchscript_exporting():
        return aten(x, size, runtime, storage_offset)
    if not _owns_storage(x):
        return aten(x, size, stride, storage_offset)
    return as_strided(x, size, runtime, storage_offset)


register(Patch(
    name="squeeze_static",
    description="squeeze() without a dim removes only the axes that are statically 1 while exporting "
                "(the exported Squeeze without axes also drops the batch axis at batch 1); squeeze(dim) of a "
                "dim that is not 1 stays a no-op under dynamo",
    targets=("torch:squeeze", "torch:Tensor.squeeze", "torch:Tensor.squeeze_"),
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

register(Patch(
    name="movedim_from_front",
    description="torch.movedim / moveaxis with a negative source (x.movedim(-1, 2)) exports under TorchScript: "
                "its Transpose got the -1 in its perm (ONNX Runtime refuses it; composed with the next Transpose, "
                "a perm index read past the end)",
    targets=("torch:movedim", "torch:Tensor.movedim", "torch:moveaxis", "torch:Tensor.moveaxis"),
    wrapper=_movedim,
    when="torchscript",
))

register(Patch(
    name="as_strided_gather",
    description="as_strided framing on a dynamic length exports: strides read with x.stride() follow the "
                "runtime sizes (both exporters); under TorchScript a gather at offset + sum(arange(size_k) * "
                "stride_k) from the flattened tensor",
    targets=("torch:as_strided", "torch:Tensor.as_strided"),
    wrapper=_as_strided,
    when="export",
))
