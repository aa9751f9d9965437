"""``mha_compact``: nn.MultiheadAttention under the TorchScript exporter, right at every shape, without shape chains.

Every check compares ONNX Runtime with the unpatched eager model at shapes the
export never saw (B=1 included, other lengths), padded key positions masked.
"""
import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_compat
from helpers import export

from onnx_compat.patches.compact_attention import KeepLeadingReshape
from onnx_compat.testing import assert_not_degenerate


class SelfAttention(nn.Module):
    """Self-attention with a key padding mask from lengths, an optional [T, S] mask, optional weights out."""

    def __init__(self, batch_first=True, attn_mask=None, need_weights=False, average=True, add_bias_kv=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first, add_bias_kv=add_bias_kv)
        self.batch_first, self.kind, self.need_weights, self.average = batch_first, attn_mask, need_weights, average

    def _mask(self, T):
        band = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() > 3  # True: not attended
        if self.kind == "bool":
            return band
        if self.kind == "float":
            return band.float() * -1e4 + torch.arange(T)[None, :].float() * 1e-2
        return None

    def forward(self, x, lengths):
        T = x.shape[1]
        pad = torch.arange(T)[None, :] >= lengths[:, None]
        h = x if self.batch_first else x.transpose(0, 1)
        out, weights = self.attn(h, h, h, key_padding_mask=pad, attn_mask=self._mask(T),
                                 need_weights=self.need_weights, average_attn_weights=self.average)
        out = out if self.batch_first else out.transpose(0, 1)
        return (out, weights) if self.need_weights else out


class CrossAttention(nn.Module):
    """Queries from one sequence, keys/values from another: of other widths (separate projection weights),
    or of the same width (``packed``: the thirds of one packed weight)."""

    def __init__(self, packed=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True) if packed else \
            nn.MultiheadAttention(16, 2, kdim=12, vdim=10, batch_first=True)
        self.packed = packed

    def forward(self, x, memory, memory_lengths):
        pad = torch.arange(memory.shape[1])[None, :] >= memory_lengths[:, None]
        if self.packed:
            return self.attn(x, memory, memory, key_padding_mask=pad, need_weights=False)[0]
        return self.attn(x, memory, memory[..., :10], key_padding_mask=pad, need_weights=False)[0]


def _self_inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, 16, generator=g), lengths


def _cross_inputs(B, T, S, seed, width=12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, S // 2), S + 1, (B,), generator=g)
    lengths[0] = S
    return torch.randn(B, T, 16, generator=g), torch.randn(B, S, width, generator=g), lengths


DYNAMIC_SELF = {0: {0: "batch", 1: "time"}, 1: {0: "batch"}}


def _compare(proto, model, args, lengths):
    """ORT against the unpatched eager model at the query frames within ``lengths`` (beyond them, a band mask
    can leave a row no key, which is NaN in eager and free to be anything in ONNX)."""
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    got = sess.run(None, feeds)
    with torch.no_grad():
        expected = model(*args)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    sizes = [tuple(a.shape) for a in args]
    assert len(got) == len(expected), sizes
    for g, e in zip(got, expected):
        e = e.numpy()
        assert g.shape == e.shape, f"at input sizes {sizes}: ONNX {g.shape}, eager {e.shape}"
        time_axis = e.ndim - 2 if e.ndim == 4 else 1  # [B, T, E], [B, T, S] or per head [B, H, T, S]
        for b, n in enumerate(lengths.tolist()):
            index = (b,) + (slice(None),) * (time_axis - 1) + (slice(0, n),)
            assert_not_degenerate(e[index], f"at input sizes {sizes}, sequence {b}")
            np.testing.assert_allclose(g[index], e[index], atol=1e-5, rtol=1e-4,
                                       err_msg=f"at input sizes {sizes}, sequence {b}")


def _ops(proto):
    return [n.op_type for n in proto.graph.node]


@pytest.mark.parametrize("variant", [
    dict(), dict(batch_first=False), dict(attn_mask="bool"), dict(attn_mask="float"),
    dict(need_weights=True), dict(need_weights=True, average=False), dict(add_bias_kv=True)],
    ids=["padding", "seq_first", "bool_mask", "float_mask", "weights", "weights_per_head", "bias_kv_falls_back"])
def test_self_attention_matches_eager_at_new_shapes(variant):
    torch.manual_seed(0)
    model = SelfAttention(**variant).eval()
    with onnx_compat.patched():
        proto = export(model, _self_inputs(3, 37, 0), "torchscript", DYNAMIC_SELF)
    for seed, (B, T) in enumerate([(1, 23), (4, 50), (2, 9)], start=1):
        args = _self_inputs(B, T, seed)
        _compare(proto, model, args, args[1])


@pytest.mark.parametrize("packed", [False, True], ids=["separate_weights", "packed_weight"])
def test_cross_attention_with_its_own_key_length_matches_eager(packed):
    torch.manual_seed(1)
    model = CrossAttention(packed).eval()
    dynamic = {0: {0: "batch", 1: "time"}, 1: {0: "batch", 1: "memory"}, 2: {0: "batch"}}
    with onnx_compat.patched():
        proto = export(model, _cross_inputs(3, 37, 29, 0, 16 if packed else 12), "torchscript", dynamic)
    for seed, (B, T, S) in enumerate([(1, 23, 40), (4, 50, 7)], start=1):
        args = _cross_inputs(B, T, S, seed, 16 if packed else 12)
        _compare(proto, model, args, torch.full((B,), T))


def test_the_attention_graph_has_no_shape_chain():
    """The unpatched (but otherwise patched) export reads T and B from shapes; the compact one does not."""
    torch.manual_seed(0)
    model = SelfAttention().eval()
    args = _self_inputs(3, 37, 0)
    with onnx_compat.patched():
        compact = export(model, args, "torchscript", DYNAMIC_SELF)
    with onnx_compat.patched(exclude=["mha_compact"]):
        usual = export(model, args, "torchscript", DYNAMIC_SELF)
    # the Shapes left: T for the padding mask in the model's forward, and nn.MultiheadAttention.forward's
    # own conversion of that bool mask to a float one (a Where over a ConstantOfShape), before the patch
    assert _ops(compact).count("Shape") <= 2 < _ops(usual).count("Shape"), (_ops(compact), _ops(usual))
    assert len(compact.graph.node) < len(usual.graph.node) / 2, (len(compact.graph.node), len(usual.graph.node))


def test_the_export_before_folding_computes_nothing_from_the_weights():
    """What the pipeline's cleanup gets (the exporter's folding off): the packed projection weight is split at
    constant widths, not at bounds computed from its shape (``chunk``: a Shape, Gathers and Slices per layer)."""
    torch.manual_seed(0)
    args = _self_inputs(3, 37, 0)
    for model in (SelfAttention().eval(), CrossAttention(packed=True).eval()):
        with onnx_compat.patched():
            f = io.BytesIO()
            torch.onnx.export(model, args if isinstance(model, SelfAttention) else _cross_inputs(3, 37, 29, 0, 16), f,
                              do_constant_folding=False, dynamo=False)
        proto = onnx.load_from_string(f.getvalue())
        weights = {t.name for t in proto.graph.initializer}
        read = [n.op_type for n in proto.graph.node if n.op_type in ("Shape", "Slice") and n.input[0] in weights]
        assert not read and "Slice" not in _ops(proto), (type(model).__name__, _ops(proto))


def test_eager_is_untouched_inside_patched():
    torch.manual_seed(0)
    model = SelfAttention(need_weights=True).eval()
    args = _self_inputs(2, 11, 0)
    with torch.no_grad():
        before = model(*args)
        with onnx_compat.patched():
            inside = model(*args)
    for a, b in zip(before, inside):
        assert torch.equal(a, b)


def test_keep_leading_reshape_copies_the_leading_dims():
    x = torch.randn(5, 3, 8)
    assert KeepLeadingReshape.apply(x, 0, -1, 2, 4).shape == (5, 3, 2, 4)
    assert torch.equal(KeepLeadingReshape.apply(x.reshape(5, 3, 2, 4), 0, 0, -1), x)
