"""Helpers inside Hugging Face ``transformers`` that defeat export, replaced while exporting.

Library patches: their targets are patched only when the user's code has
imported the modeling module, and each is unavailable (with the reason) when
transformers is absent or the helper's signature is not the one expected.

``tf_same_padding`` (either exporter)
    MobileNetV1/V2 with ``tf_padding=True`` pad through ``apply_tf_padding``,
    which reads ``int(features.shape[-2])``: TorchScript bakes H and W, dynamo
    specialises them. The same TF "SAME" rule is computed from the runtime
    sizes without a branch, so the pads stay expressions of H and W.
``conv_geometry_ints`` (dynamo exporter)
    ``MimiConv1d``/``EncodecConv1d`` keep stride, kernel size and total
    padding as tensor buffers; their padding arithmetic on those tensors
    makes the pad amounts data-dependent under dynamo
    ("GuardOnDataDependentSymNode"). They are constants of the module: while
    exporting, ``forward`` computes them as Python ints from the wrapped
    ``nn.Conv1d``'s own configuration, with the same formulas. The
    TorchScript exporter traces the tensor arithmetic right and is left alone.

A modeling module imported for the first time inside the export (not before)
is not patched: build the model first, as one does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from onnx_compat.patches.registry import Patch, register


def _tf_pad_along(size, kernel: int, stride: int):
    """transformers' rule, ``max(k - (size % s or s), 0)``, as ``ceil(size / s)·s - size + k - s``
    (the same number: write size = q·s + r). A ceiling and no branch: the expression stays
    linear in ``size``, which keeps torch.export's symbolic sizes small through a deep stack."""
    along = (size + stride - 1) // stride * stride - size + kernel - stride
    if kernel >= stride:
        return along  # never negative
    if isinstance(along, torch.Tensor):  # TorchScript: traced sizes
        return along.clamp(min=0)
    return getattr(torch, "sym_max", max)(along, 0)


def tf_same_pads(height, width, kernel, stride, dilation):
    """transformers' ``apply_tf_padding`` amounts ``(left, right, top, bottom)`` for runtime sizes."""
    along_h = _tf_pad_along(height, kernel[0], stride[0])
    along_w = _tf_pad_along(width, kernel[1], stride[1])
    top, left = along_h // 2, along_w // 2
    return [left * dilation[1], (along_w - left) * dilation[1], top * dilation[0], (along_h - top) * dilation[0]]


def _apply_tf_padding(wrapped, instance, args, kwargs):
    features = args[0] if args else kwargs["features"]
    conv = args[1] if len(args) > 1 else kwargs["conv_layer"]
    pads = tf_same_pads(features.shape[-2], features.shape[-1], conv.kernel_size, conv.stride, conv.dilation)
    return F.pad(features, pads, "constant", 0.0)


def conv_geometry(conv: torch.nn.Conv1d):
    """(stride, effective kernel, total padding) as the transformers modules compute them, as ints."""
    stride = conv.stride[0]
    kernel = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1
    return stride, kernel, kernel - stride


def _extra_padding(length, stride: int, kernel: int, padding_total: int):
    """``ceil((L - k + p) / s + 1) - 1`` frames, the length they need, minus ``L``; integer-only.

    The ceiling is ``(a + s - 1) // s`` with a non-negative numerator (``p = k - s``
    makes it ``L - 1``): the dynamo exporter writes a SymInt floor division as
    ONNX ``Div``, which truncates, so a negative numerator would round the wrong way.
    """
    frames = (length - kernel + padding_total + stride - 1) // stride
    return frames * stride + kernel - padding_total - length


def _conv1d_forward(wrapped, instance, args, kwargs):
    if len(args) > 1 or set(kwargs) - {"hidden_states", "padding_cache"} or kwargs.get("padding_cache") is not None:
        return wrapped(*args, **kwargs)  # streaming cache: left as it is
    hidden_states = args[0] if args else kwargs["hidden_states"]
    stride, kernel, padding_total = conv_geometry(instance.conv)
    extra = _extra_padding(hidden_states.shape[-1], stride, kernel, padding_total)
    if instance.causal:
        paddings = (padding_total, extra)
    else:
        right = padding_total // 2
        paddings = (padding_total - right, right + extra)
    hidden_states = instance._pad1d(hidden_states, paddings, mode=instance.pad_mode)
    hidden_states = instance.conv(hidden_states)
    if getattr(instance, "norm_type", None) == "time_group_norm":
        hidden_states = instance.norm(hidden_states)
    return hidden_states


_MODELS = "transformers.models."

register(Patch(
    name="tf_same_padding",
    description="transformers MobileNetV1/V2 tf_padding=True keep H and W dynamic (TF 'SAME' pads computed "
                "from the runtime size instead of int(shape))",
    targets=(_MODELS + "mobilenet_v1.modeling_mobilenet_v1:apply_tf_padding",
             _MODELS + "mobilenet_v2.modeling_mobilenet_v2:apply_tf_padding"),
    wrapper=_apply_tf_padding,
    when="export",
    library="transformers",
    signature=("features", "conv_layer"),
))

register(Patch(
    name="conv_geometry_ints",
    description="transformers Mimi/EnCodec convolutions read stride/kernel/padding as ints while exporting, "
                "so lengths stay symbolic under dynamo (no data-dependent pads)",
    targets=(_MODELS + "mimi.modeling_mimi:MimiConv1d.forward",
             _MODELS + "encodec.modeling_encodec:EncodecConv1d.forward"),
    wrapper=_conv1d_forward,
    when="dynamo",
    aliases=False,
    library="transformers",
    signature=("self", "hidden_states"),
))
