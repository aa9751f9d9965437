"""Attention patches: both exporters, ONNX Runtime vs the unpatched eager model at new B and T."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import onnx_compat
from onnx_compat import versions
from onnx_compat.testing import GRAD_MODES, PatchCase, patch_case_tests

from models import mask_of

D, HEADS = 16, 4


class MHA(nn.Module):
    """Self-attention over [B, T, D] with a key padding mask from lengths."""

    def __init__(self, batch_first=True, need_weights=False):
        super().__init__()
        self.batch_first, self.need_weights = batch_first, need_weights
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=batch_first)

    def forward(self, x, lengths):
        pad = ~mask_of(x, lengths)
        if not self.batch_first:
            x = x.transpose(0, 1)
        y, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=self.need_weights)
        return y if self.batch_first else y.transpose(0, 1)


class Encoder(nn.Module):
    """TransformerEncoderLayer, or a TransformerEncoder of two, with src_key_padding_mask."""

    def __init__(self, layers=0):
        super().__init__()
        layer = nn.TransformerEncoderLayer(D, HEADS, 32, dropout=0.1, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=True) if layers else layer

    def forward(self, x, lengths):
        return self.body(x, src_key_padding_mask=~mask_of(x, lengths))


class SDPA(nn.Module):
    """F.scaled_dot_product_attention with the masks speech models build from lengths."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        kv_heads = HEADS // 2 if kind == "gqa" else HEADS
        self.q = nn.Linear(D, D)
        self.kv = nn.Linear(D, 2 * kv_heads * (D // HEADS))
        self.kv_heads = kv_heads
        self.rel = nn.Embedding(2 * 8 + 1, HEADS)  # relative-position bias, clipped at +-8

    def forward(self, x, lengths):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, HEADS, -1).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2 * self.kv_heads, -1).transpose(1, 2).chunk(2, dim=1)
        valid = mask_of(x, lengths)
        if self.kind == "float":  # as transformers builds it: padding mask plus a learned position bias
            keep = valid[:, None, None, :].expand(B, 1, T, T).to(x.dtype)
            pad = (1.0 - keep).masked_fill((1.0 - keep).bool(), torch.finfo(x.dtype).min)
            pos = torch.arange(T, device=x.device)
            bias = self.rel((pos[None, :] - pos[:, None]).clamp(-8, 8) + 8).permute(2, 0, 1)[None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=pad + bias)
        elif self.kind == "bool_full_rows":  # padded query rows see no key at all
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, :, None] & valid[:, None, None, :])
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], enable_gqa=True)
        return y.transpose(1, 2).reshape(B, T, D)


# What older torch releases lack (make test-matrix); the tests that need it skip there.
FASTPATH_OFF = "mha_fastpath_off" not in onnx_compat.unavailable_patches()  # torch.backends.mha (2.2+)
try:
    F.scaled_dot_product_attention(*torch.ones(3, 1, 2, 2).unbind(0), enable_gqa=True)
    HAS_GQA = True
except TypeError:  # torch < 2.5
    HAS_GQA = False
try:
    F.scaled_dot_product_attention(*torch.ones(3, 1, 2, 2).unbind(0), scale=0.5)
    HAS_SCALE = True
except TypeError:  # torch 2.0
    HAS_SCALE = False
# eager SDPA of a fully masked row: zeros on current torch, NaN on older releases (2.1)
NAN_ROWS = bool(F.scaled_dot_product_attention(*torch.ones(3, 1, 2, 2).unbind(0),
                                               attn_mask=torch.zeros(2, 2, dtype=torch.bool)).isnan().any())


def _never(exporter):
    return None


def _needs_fastpath_off(exporter):
    if not FASTPATH_OFF:
        return f"torch {torch.__version__} has no torch.backends.mha to turn MHA's fast path off while exporting"
    return None


def _needs_gqa(exporter):
    return None if HAS_GQA else f"torch {torch.__version__}'s scaled_dot_product_attention has no enable_gqa"


def _needs_zero_rows(exporter):
    if NAN_ROWS:
        return f"torch {torch.__version__}'s eager SDPA gives NaN for fully masked rows: nothing to compare"
    return None


def _inputs(B, T, seed):
    """Random lengths, the first full; every checked batch (seed > 0, B > 1) has a half-length sequence."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    if seed and B > 1:
        lengths[1] = T // 2
    return torch.randn(B, T, D, generator=g), lengths


def _valid_frames(inputs):
    return mask_of(*inputs).numpy()


def _padded_rows_are_zero(got, expected, inputs):
    """Eager gives zeros for query rows that see no key (padded frames); the graph must too."""
    padded = ~mask_of(*inputs).numpy()
    if len(padded) > 1:
        assert padded.any() and np.all(expected[0][padded] == 0), "eager's padded rows are not zeros"


def _case(name, build, vanilla=None, grad_mode="no_grad", **options):
    """[B, T, D] and lengths [B]; compared on valid frames unless ``keep`` says otherwise."""
    options.setdefault("keep", _valid_frames)
    return PatchCase(name, build, _inputs, {0: {0: "batch", 1: "time"}, 1: {0: "batch"}}, vanilla=vanilla or {},
                     grad_mode=GRAD_MODES[grad_mode], atol=1e-4, rtol=1e-3, **options)


def _mha(name, *args, vanilla=None, grad_mode="no_grad"):
    return _case(name, lambda: MHA(*args), vanilla, grad_mode, skip=_needs_fastpath_off if args[0] else _never)


def _encoder(name, layers, vanilla=None, grad_mode="no_grad"):
    return _case(name, lambda: Encoder(layers), vanilla, grad_mode, skip=_needs_fastpath_off)


def _pooled(name, left_padded):
    """Pooled over all frames, padded ones too: eager's nested path zeros them, the graph must as well."""
    return _case(name, lambda: PooledEncoder(left_padded), keep=None, skip=_needs_fastpath_off,
                 sizes=((1, 23), (3, 50), (4, 9)))


class PooledEncoder(nn.Module):
    """A nested-tensor TransformerEncoder (final norm) pooled over *all* frames: padded ones count."""

    def __init__(self, left_padded=False):
        super().__init__()
        layer = nn.TransformerEncoderLayer(D, HEADS, 32, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D), enable_nested_tensor=True)
        self.left_padded = left_padded

    def forward(self, x, lengths):
        pad = ~mask_of(x, lengths)
        if self.left_padded:  # padding first: eager's nested path is not taken (not left-aligned)
            pad = pad.flip(1)
        return self.body(x, src_key_padding_mask=pad).mean(1)


# How the unpatched export goes wrong, per exporter, under the autograd mode of the case's export
# ("grad" for SDPA, "no_grad" else, other modes as cases of their own); absent: it works.
CASES = [
    _mha("mha_batch_first", True, False, vanilla={"torchscript": "_native_multi_head_attention"}),
    _mha("mha_batch_first_with_grad", True, False, grad_mode="grad",
         vanilla={"torchscript": ("Reshape", "aten::unflatten")}),  # torch 2.0: no unflatten at all
    _mha("mha_batch_first_weights", True, True),
    _mha("mha_time_first", False, False),
    _mha("mha_time_first_weights", False, True),
    _mha("mha_time_first_weights_with_grad", False, True, grad_mode="grad",
         vanilla={"torchscript": ("Reshape", "aten::unflatten")}),
    _encoder("encoder_layer", 0, vanilla={"torchscript": "_transformer_encoder_layer_fwd"}),
    _encoder("encoder_layer_inference_mode", 0, grad_mode="inference_mode"),
    _encoder("encoder_2_layers", 2),
    _encoder("encoder_2_layers_inference_mode", 2, grad_mode="inference_mode",
             vanilla={"torchscript": ("_nested_tensor_from_mask", "aten::logical_not")}),
    _case("sdpa_float_mask", lambda: SDPA("float"), {"dynamo": "Cannot view a tensor"}, "grad"),
    _case("sdpa_bool_full_rows", lambda: SDPA("bool_full_rows"), {"dynamo": "mismatch"}, "grad",
          keep=None, also=_padded_rows_are_zero, skip=_needs_zero_rows,
          fails_here=lambda exporter: versions.torch_at_least("2.13")),  # right on 2.8 (make test-matrix)
    _case("sdpa_gqa", lambda: SDPA("gqa"), {"torchscript": "enable_gqa"}, "grad", skip=_needs_gqa),
    _pooled("pooled_encoder", False),
    _pooled("pooled_encoder_left_padded", True),  # padding first: eager's nested path is not taken
]
test_patched_export_matches_eager, test_vanilla_export_fails_as_recorded = patch_case_tests(CASES)


@pytest.mark.skipif(not FASTPATH_OFF, reason="this torch has no torch.backends.mha")
def test_fastpath_setting_is_read_not_written():
    before = torch.backends.mha.get_fastpath_enabled()
    with onnx_compat.patched(only=["mha_fastpath_off"]):
        assert torch.backends.mha.get_fastpath_enabled() is before  # not exporting: untouched
    assert torch.backends.mha.get_fastpath_enabled() is before


def test_eager_sdpa_is_untouched_inside_patched():
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    mask = torch.rand(5, 5) > 0.4
    mask[3] = False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with onnx_compat.patched():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert F.scaled_dot_product_attention.__wrapped__ is not None
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)  # bit-identical (NaN rows on torch 2.1)


def test_math_attention_agrees_with_sdpa_eagerly():
    """The export-time formula against eager SDPA, every option, without exporting."""
    from onnx_compat.patches.attention import math_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    bool_mask = torch.rand(2, 1, 6, 9, generator=g) > 0.3
    bool_mask[0, 0, 2] = False  # a fully masked row
    float_mask = torch.randn(2, 1, 6, 9, generator=g).masked_fill(~bool_mask, float("-inf"))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    for kwargs in [{}, {"attn_mask": bool_mask}, {"attn_mask": float_mask}, {"is_causal": True}, {"scale": 0.3}]:
        if "scale" in kwargs and not HAS_SCALE:
            continue  # torch 2.0's SDPA has no scale=
        expected = F.scaled_dot_product_attention(q, kk, vv, **kwargs)
        expected = expected.nan_to_num(0.0)  # fully masked rows: NaN on older torch, the zeros of current torch
        torch.testing.assert_close(math_attention(q, kk, vv, **kwargs), expected)
        torch.testing.assert_close(math_attention(q, k, v, enable_gqa=True, **kwargs), expected)
    assert math_attention(q, kk, vv, attn_mask=bool_mask)[0, :, 2].abs().sum() == 0


@pytest.mark.skipif(not FASTPATH_OFF, reason="this torch has no torch.backends.mha to turn MHA's fast path off")
def test_without_the_zeros_patch_padded_positions_differ(exporter):
    """The fast path off alone exports, but padded positions are not eager's zeros: pooled numbers differ."""
    case = next(c for c in CASES if c.name == "pooled_encoder")
    model = case.model()
    with onnx_compat.patched(exclude=["nested_tensor_zeros"]):
        proto = case.export(model, exporter)
    with pytest.raises(AssertionError, match="(?s)differs from eager at .*Mismatched elements"):
        case.assert_matches(proto, model)
