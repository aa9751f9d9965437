"""Attention: ``nn.MultiheadAttention``, the Transformer layers and SDPA.

Four patches, each for a failure measured on torch 2.13:

``mha_in_projection`` (TorchScript exporter)
    ``F._in_projection_packed`` splits the packed q/k/v projection with
    ``unflatten(-1, (3, E))``; the tracer records the full view shape, so the
    sequence length of the example is baked into a Reshape and the model fails
    at any other T, silently at export time. ``chunk`` splits on the last axis
    only and traces as a Split.
``mha_fastpath_off`` (either exporter)
    Under ``no_grad``/``inference_mode`` MHA and ``TransformerEncoder(Layer)``
    take a fused fast path (``_native_multi_head_attention``,
    ``_transformer_encoder_layer_fwd``, nested tensors) that has no ONNX
    export. While exporting, ``torch.backends.mha.get_fastpath_enabled()``
    answers False; the user's setting itself is never written, so there is
    nothing to restore.
``nested_tensor_zeros`` (either exporter)
    In inference, ``TransformerEncoder(enable_nested_tensor=True)`` with a
    ``src_key_padding_mask`` runs its layers on a nested tensor and pads the
    result with exact zeros (then applies its final norm). With the fast path
    off while exporting, padded positions get other values, and a model that
    pools over time after the encoder gives other numbers. The patch zeroes
    them where eager would have nested (its own conditions; the left-aligned
    padding check is computed in the graph).
``sdpa_math`` (either exporter)
    ``F.scaled_dot_product_attention`` written out as matmul/softmax/matmul.
    The dynamo exporter's decomposition of SDPA fails on float masks built from
    the input ("Cannot view a tensor with shape ..."), and answers a row whose
    keys are all masked with a uniform average where eager PyTorch gives 0; the
    TorchScript exporter has no ``enable_gqa``. The written-out form has none
    of these problems. Under the TorchScript exporter it takes over only for
    ``enable_gqa`` (that exporter's own SDPA is otherwise right, fully masked
    rows included). Eager SDPA outside an export is untouched.
"""
from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F

from onnx_compat import versions

from onnx_compat.patches import when
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._static import static_ints


def in_projection_packed(wrapped, instance, args, kwargs):
    """``F._in_projection_packed`` with ``chunk`` instead of ``unflatten``."""
    q, k, v, w, *rest = args
    b = rest[0] if rest else kwargs.get("b")
    if k is v and q is k:
        return [t.contiguous() for t in F.linear(q, w, b).chunk(3, dim=-1)]
    if k is v:
        E = w.shape[1]
        w_q, w_kv = w.split([E, E * 2])
        b_q, b_kv = (None, None) if b is None else b.split([E, E * 2])
        k_proj, v_proj = F.linear(k, w_kv, b_kv).chunk(2, dim=-1)
        return [F.linear(q, w_q, b_q), k_proj.contiguous(), v_proj.contiguous()]
    return wrapped(*args, **kwargs)  # three separate linears: nothing baked


def fastpath_disabled(wrapped, instance, args, kwargs):
    return False


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def _bind_sdpa(args, kwargs):
    if len(args) > len(_SDPA_PARAMS) or any(k not in _SDPA_PARAMS for k in kwargs):
        return None
    bound = dict(_SDPA_DEFAULTS)
    bound.update(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    if any(p not in bound for p in _SDPA_PARAMS[:3]):
        return None
    return bound


def math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    """SDPA as eager PyTorch defines it, in ops both exporters translate."""
    if scale is None:
        scale = 1.0 / math.sqrt(static_ints(query.shape[-1:])[0])  # head width: a model constant
    if enable_gqa:
        q_heads, kv_heads = static_ints((query.shape[-3], key.shape[-3]))
        repeats = q_heads // kv_heads
        key = key.repeat_interleave(repeats, dim=-3)
        value = value.repeat_interleave(repeats, dim=-3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        L, S = query.shape[-2], key.shape[-2]
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if attn_mask is not None:
        # A row with every key masked is 0 in eager PyTorch (softmax alone gives NaN).
        none_left = scores.amax(dim=-1, keepdim=True) == float("-inf")
        weights = weights.masked_fill(none_left, 0.0)
    if dropout_p > 0.0:
        weights = torch.dropout(weights, dropout_p, True)
    return torch.matmul(weights, value)


def _torchscript_writes_sdpa() -> bool:
    """Whether this torch's TorchScript exporter has a symbolic for SDPA (torch 2.0 has none)."""
    for where in ("torch.onnx._internal.torchscript_exporter.symbolic_opset14", "torch.onnx.symbolic_opset14"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        return hasattr(module, "scaled_dot_product_attention")
    return False


_TORCHSCRIPT_SDPA = _torchscript_writes_sdpa()
# The TorchScript exporter's SDPA gives eager's zeros for a fully masked row of a bool mask from this release
# on (make test-matrix: torch 2.8's gives NaN in ONNX Runtime; releases between are untested, so patched)
_TORCHSCRIPT_MASKED_ROWS = versions.torch_at_least("2.13")


def sdpa_wrapper(wrapped, instance, args, kwargs):
    b = _bind_sdpa(args, kwargs)
    if b is None or (b["is_causal"] and b["attn_mask"] is not None):
        return wrapped(*args, **kwargs)  # let PyTorch raise its own error
    if when.torchscript_exporting() and not b["enable_gqa"] and _TORCHSCRIPT_SDPA and (
            _TORCHSCRIPT_MASKED_ROWS or b["attn_mask"] is None or b["attn_mask"].dtype != torch.bool):
        return wrapped(*args, **kwargs)  # the TorchScript exporter's own SDPA is right; keep its graph
    return math_attention(**b)


def _would_nest(encoder, src, mask, padding) -> bool:
    """Whether eager ``TransformerEncoder.forward`` (torch 2.x, in inference) runs the layers on a nested
    tensor, which leaves exact zeros at padded positions. The same checks as there, but grad mode
    (an exported model is used for inference) and the data-dependent alignment check (in the graph)."""
    first = encoder.layers[0] if len(encoder.layers) else None
    return (getattr(encoder, "use_nested_tensor", False) and first is not None and not first.training
            and isinstance(src, torch.Tensor) and src.dim() == 3 and not src.is_nested
            and padding is not None and mask is None and not torch.is_autocast_enabled()
            and src.device.type in ("cpu", "cuda", "xpu"))


def encoder_forward(wrapped, instance, args, kwargs):
    """``TransformerEncoder.forward`` with the fast path off, padded positions zeroed as the nested path does."""
    names = ("src", "mask", "src_key_padding_mask", "is_causal")
    if len(args) > len(names) or set(kwargs) - set(names):
        return wrapped(*args, **kwargs)
    bound = {**dict(zip(names, args)), **kwargs}
    src, padding = bound.get("src"), bound.get("src_key_padding_mask")
    if not _would_nest(instance, src, bound.get("mask"), padding):
        return wrapped(*args, **kwargs)
    norm = instance.norm
    instance.norm = None  # eager zeroes the padded rows before the final norm
    try:
        out = wrapped(*args, **kwargs)
    finally:
        instance.norm = norm
    pad = padding if padding.dtype == torch.bool else padding != 0  # [B, T], True where padded
    if getattr(instance, "mask_check", True):  # eager nests only when every row's padding is at its end
        aligned = (pad[:, :-1] & pad[:, 1:].logical_not()).any().logical_not()  # no frame after padding
        pad = pad & aligned
    out = out.masked_fill(pad[..., None], 0.0)
    return norm(out) if norm is not None else out


register(Patch(
    name="mha_in_projection",
    description="nn.MultiheadAttention / TransformerEncoderLayer keep the sequence length dynamic "
                "under the TorchScript exporter (no T baked into a Reshape of the packed in-projection)",
    targets=("torch.nn.functional:_in_projection_packed",),
    wrapper=in_projection_packed,
    when="torchscript",
    aliases=False,
))

register(Patch(
    name="mha_fastpath_off",
    description="MHA/Transformer fast path off while exporting, so no_grad/inference_mode exports do not "
                "hit _native_multi_head_attention, _transformer_encoder_layer_fwd or nested tensors",
    targets=("torch.backends.mha:get_fastpath_enabled",),
    wrapper=fastpath_disabled,
    when="export",
    aliases=False,
))

register(Patch(
    name="sdpa_math",
    description="F.scaled_dot_product_attention as explicit matmul/softmax: dynamo exports float masks "
                "built from the input, fully masked rows give 0 as in eager, enable_gqa works under TorchScript",
    targets=("torch.nn.functional:scaled_dot_product_attention",),
    wrapper=sdpa_wrapper,
    when="export",
))

register(Patch(
    name="nested_tensor_zeros",
    description="TransformerEncoder(enable_nested_tensor=True) with a padding mask returns 0 at padded positions "
                "in the export, as eager's nested-tensor path does",
    targets=("torch.nn.modules.transformer:TransformerEncoder.forward",),
    wrapper=encoder_forward,
    when="export",
    aliases=False,
    requires=("mha_fastpath_off",),
))
