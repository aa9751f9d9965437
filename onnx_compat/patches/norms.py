"""Normalisations the TorchScript exporter cannot write (measured on torch 2.13).

``rms_norm``
    ``F.rms_norm`` / ``nn.RMSNorm``: "Exporting the operator 'aten::rms_norm'
    ... is not supported". Written out as PyTorch defines it:
    ``x * rsqrt(mean(x², normalized dims) + eps) * weight``, ``eps`` defaulting
    to the dtype's machine epsilon; half-precision input is computed in float32.
``instance_norm_running_stats``
    ``InstanceNorm1d/2d/3d(track_running_stats=True)`` in eval normalises with
    the running statistics, which the exporter refuses ("instance_norm
    training for unknown batch size"). With running statistics, instance norm
    *is* batch norm in inference mode, which exports as
    ``BatchNormalization``.
``group_norm_traced_groups``
    ``F.group_norm`` / ``nn.GroupNorm`` whose ``num_groups`` is computed from a
    shape (``h.shape[1] // 4``): the tracer makes it a 0-d tensor and the
    exporter wants a constant ("Expected node type 'onnx::Constant' for
    argument 'num_groups'"; issue #47, 5). Written out with the groups taken
    from the graph: the input reshaped to ``[B, groups, -1]``, normalised with
    the biased variance, reshaped back, then the per-channel affine.

The dynamo exporter handles both; these act under the TorchScript exporter only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """``F.rms_norm`` in ops every exporter writes."""
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    work = x.float() if x.dtype in _LOW_PRECISION else x
    y = work * torch.rsqrt(work.pow(2).mean(dims, keepdim=True) + eps)
    y = y.to(x.dtype)
    return y * weight if weight is not None else y


def _rms_norm(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "normalized_shape", "weight", "eps"),
                    {"weight": None, "eps": None})
    if b is None:
        return wrapped(*args, **kwargs)
    shape = b["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if tuple(b["input"].shape[-len(shape):]) != shape:
        return wrapped(*args, **kwargs)  # PyTorch's own error
    return rms_norm(b["input"], shape, b["weight"], b["eps"])


_IN_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps")
_IN_DEFAULTS = {"running_mean": None, "running_var": None, "weight": None, "bias": None, "use_input_stats": True,
                "momentum": 0.1, "eps": 1e-5}


def _instance_norm(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, _IN_PARAMS, _IN_DEFAULTS)
    if b is None or b["use_input_stats"] or b["running_mean"] is None or b["running_var"] is None:
        return wrapped(*args, **kwargs)  # statistics from the input: InstanceNormalization exports
    return F.batch_norm(b["input"], b["running_mean"], b["running_var"], b["weight"], b["bias"],
                        training=False, momentum=0.0, eps=b["eps"])


def group_norm(x, groups, weight=None, bias=None, eps=1e-5):
    """``F.group_norm`` in ops every exporter writes; ``groups`` may be a traced size."""
    work = x.float() if x.dtype in _LOW_PRECISION else x
    grouped = work.reshape(x.shape[0], groups, -1)
    mean = grouped.mean(-1, keepdim=True)
    centred = grouped - mean
    y = (centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)).reshape_as(work).to(x.dtype)
    channel = (1, -1) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(channel)
    return y + bias.reshape(channel) if bias is not None else y


def _group_norm(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "num_groups", "weight", "bias", "eps"),
                    {"weight": None, "bias": None, "eps": 1e-5})
    if b is None or not isinstance(b["num_groups"], torch.Tensor) or b["input"].dim() < 2:
        return wrapped(*args, **kwargs)  # an int: GroupNormalization exports
    return group_norm(b["input"], b["num_groups"], b["weight"], b["bias"], b["eps"])


register(Patch(
    name="group_norm_traced_groups",
    description="F.group_norm / nn.GroupNorm with num_groups computed from a shape export under TorchScript "
                "(written out with the groups taken from the graph)",
    targets=("torch.nn.functional:group_norm",),
    wrapper=_group_norm,
    when="torchscript",
))

register(Patch(
    name="rms_norm",
    description="F.rms_norm / nn.RMSNorm export under TorchScript (written out: x * rsqrt(mean(x^2) + eps) * weight)",
    targets=("torch.nn.functional:rms_norm",),
    wrapper=_rms_norm,
    when="torchscript",
))

register(Patch(
    name="instance_norm_running_stats",
    description="InstanceNorm(track_running_stats=True) in eval exports under TorchScript "
                "(normalised with the running statistics, as BatchNormalization)",
    targets=("torch.nn.functional:instance_norm",),
    wrapper=_instance_norm,
    when="torchscript",
))
