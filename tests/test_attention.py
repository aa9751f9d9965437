"""Attention patches: both exporters, ONNX Runtime vs the unpatched eager model at new B and T."""
import contextlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import onnx_compat
from onnx_compat import versions


from helpers import EXPORTERS, export, run, vanilla_failure
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


CASES = {
    "mha_batch_first": lambda: MHA(True, False),
    "mha_batch_first_weights": lambda: MHA(True, True),
    "mha_time_first": lambda: MHA(False, False),
    "mha_time_first_weights": lambda: MHA(False, True),
    "encoder_layer": lambda: Encoder(0),
    "encoder_2_layers": lambda: Encoder(2),
    "sdpa_float_mask": lambda: SDPA("float"),
    "sdpa_bool_full_rows": lambda: SDPA("bool_full_rows"),
    "sdpa_gqa": lambda: SDPA("gqa"),
}
# How the unpatched export goes wrong, per exporter; None: it works.
# key: (case, exporter, grad mode at export)
VANILLA = {
    ("mha_batch_first", "torchscript", "grad"): ("Reshape", "aten::unflatten"),  # torch 2.0: no unflatten at all
    ("mha_time_first_weights", "torchscript", "grad"): ("Reshape", "aten::unflatten"),
    ("mha_batch_first", "torchscript", "no_grad"): "_native_multi_head_attention",
    ("encoder_layer", "torchscript", "no_grad"): "_transformer_encoder_layer_fwd",
    ("encoder_2_layers", "torchscript", "inference_mode"): ("_nested_tensor_from_mask", "aten::logical_not"),
    ("sdpa_float_mask", "dynamo", "grad"): "Cannot view a tensor",
    ("sdpa_bool_full_rows", "dynamo", "grad"): "mismatch",
    ("sdpa_gqa", "torchscript", "grad"): "enable_gqa",
}
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


def _skip_where_unsupported(name):
    if not FASTPATH_OFF and (name.startswith("mha_batch_first") or name.startswith("encoder")):
        pytest.skip(f"torch {torch.__version__} has no torch.backends.mha to turn MHA's fast path off while exporting")
    if name == "sdpa_gqa" and not HAS_GQA:
        pytest.skip(f"torch {torch.__version__}'s scaled_dot_product_attention has no enable_gqa")
    if name == "sdpa_bool_full_rows" and NAN_ROWS:
        pytest.skip(f"torch {torch.__version__}'s eager SDPA gives NaN for fully masked rows: nothing to compare")


# failures that older releases do not have (make test-matrix): the first release where each was seen
VANILLA_SINCE = {("sdpa_bool_full_rows", "dynamo"): "2.13"}
GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad": contextlib.nullcontext}


def _inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, D, generator=g), lengths


def _build(name):
    torch.manual_seed(sum(map(ord, name)))
    return CASES[name]().eval()


def _export(model, exporter, grad_mode="no_grad"):
    with GRAD_MODES[grad_mode]():
        return export(model, _inputs(2, 37, 0), exporter, {0: {0: "batch", 1: "time"}, 1: {0: "batch"}})


def _check(proto, model, name):
    """ORT equals the unpatched eager model at B=1/T=23 and B=3/T=50 (valid frames;
    all frames where padded rows have a defined eager value)."""
    for seed, (B, T) in enumerate([(1, 23), (3, 50)], start=1):
        x, lengths = _inputs(B, T, seed)
        if B > 1:
            lengths[1] = T // 2  # a padded sequence in every check
        with torch.no_grad():
            expected = model(x, lengths).numpy()
        got = run(proto, x.numpy(), lengths.numpy())[0]
        assert got.shape == expected.shape
        keep = np.ones(expected.shape[:2], bool) if name == "sdpa_bool_full_rows" else mask_of(x, lengths).numpy()
        assert np.std(expected[keep]) > 1e-3
        if name == "sdpa_bool_full_rows" and B > 1:
            padded = ~mask_of(x, lengths).numpy()
            assert padded.any() and np.all(expected[padded] == 0)
        np.testing.assert_allclose(got[keep], expected[keep], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_patched_export_matches_eager(name, exporter):
    _skip_where_unsupported(name)
    model = _build(name)
    grad_mode = "grad" if name.startswith("sdpa") else "no_grad"  # the settings under which they fail
    with onnx_compat.patched():
        proto = _export(model, exporter, grad_mode)
    _check(proto, model, name)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("encoder")])
def test_encoders_export_under_inference_mode(name, exporter):
    _skip_where_unsupported(name)
    model = _build(name)
    with onnx_compat.patched():
        proto = _export(model, exporter, "inference_mode")
    _check(proto, model, name)


@pytest.mark.parametrize("name,exporter,grad_mode", sorted(VANILLA))
def test_vanilla_export_fails_as_recorded(name, exporter, grad_mode):
    """Without the patches these cases break, so the patched tests cannot pass by accident."""
    if exporter not in EXPORTERS:
        pytest.skip(versions.NO_DYNAMO)
    since = VANILLA_SINCE.get((name, exporter))
    if since and not versions.torch_at_least(since):
        pytest.skip(f"torch {torch.__version__}'s unpatched {exporter} export of {name} is right (measured on 2.8)")
    model = _build(name)
    vanilla_failure(lambda: _check(_export(model, exporter, grad_mode), model, name), VANILLA[name, exporter, grad_mode])


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


def _pooled_check(proto, model):
    for seed, (B, T) in enumerate([(1, 23), (3, 50), (4, 9)], start=1):
        x, lengths = _inputs(B, T, seed)
        if B > 1:
            lengths[1] = T // 2
        with torch.no_grad():
            expected = model(x, lengths).numpy()
        np.testing.assert_allclose(run(proto, x.numpy(), lengths.numpy())[0], expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("left_padded", [False, True])
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.skipif(not FASTPATH_OFF, reason="this torch has no torch.backends.mha to turn MHA's fast path off")
def test_nested_tensor_zeros_at_padded_positions(exporter, left_padded):
    torch.manual_seed(3)
    model = PooledEncoder(left_padded).eval()
    with onnx_compat.patched():
        proto = _export(model, exporter, "no_grad")
    _pooled_check(proto, model)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.skipif(not FASTPATH_OFF, reason="this torch has no torch.backends.mha to turn MHA's fast path off")
def test_without_the_zeros_patch_padded_positions_differ(exporter):
    """The fast path off alone exports, but padded positions are not eager's zeros: pooled numbers differ."""
    torch.manual_seed(3)
    model = PooledEncoder().eval()
    with onnx_compat.patched(exclude=["nested_tensor_zeros"]):
        proto = _export(model, exporter, "no_grad")
    with pytest.raises(AssertionError, match="Mismatched elements"):
        _pooled_check(proto, model)
