"""Recurrent patches: LSTM/GRU with a dynamic time dim and packed sequences, both exporters,
ONNX Runtime against the unpatched eager model at new B and T (B=1 too)."""
import os

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import onnx_compat
from onnx_compat import check_rasr
from onnx_compat import export as pipeline_export
from onnx_compat import versions

from onnx_compat.models import blstm
from onnx_compat.patches.recurrent import DYNAMO_WRITES_RNN

from helpers import EXPORTERS, HAS_DYNAMO, export, run

F_IN, HIDDEN = 6, 5


class Recurrent(nn.Module):
    """x [B, T, F] -> (y [B, T, D*H], h_n[, c_n]); time-first layers get x transposed."""

    def __init__(self, mode, layers, bidirectional, batch_first, initial_state, packed=False, proj=0):
        super().__init__()
        self.mode, self.batch_first, self.initial, self.packed = mode, batch_first, initial_state, packed
        cls = nn.LSTM if mode == "LSTM" else nn.GRU
        extra = {"proj_size": proj} if proj else {}
        self.rnn = cls(F_IN, HIDDEN, layers, batch_first=batch_first, bidirectional=bidirectional, **extra)
        self.states = layers * (2 if bidirectional else 1)
        self.init = nn.Linear(F_IN, HIDDEN)
        self.proj = proj

    def forward(self, x, lengths):
        hx = None
        if self.initial:  # states computed from the input: batch-dependent
            c0 = torch.tanh(self.init(x.mean(1)))[None].expand(self.states, -1, -1).contiguous()
            h0 = c0[..., :self.proj] if self.proj else c0  # LSTMP: h has the projected width
            hx = (h0, 0.5 * c0) if self.mode == "LSTM" else h0
        seq = x if self.batch_first else x.transpose(0, 1)
        if self.packed:
            seq = pack_padded_sequence(seq, lengths.cpu(), batch_first=self.batch_first, enforce_sorted=False)
        y, state = self.rnn(seq, hx)
        if self.packed:
            y, _ = pad_packed_sequence(y, batch_first=self.batch_first, total_length=x.shape[1])
        y = y if self.batch_first else y.transpose(0, 1)
        y = y.reshape(y.shape[0], y.shape[1], -1)  # a shape use after the RNN
        states = state if self.mode == "LSTM" else (state,)
        return (y,) + tuple(s.transpose(0, 1).reshape(x.shape[0], -1) for s in states)


# (mode, layers, bidirectional, batch_first, initial_state): every option in some case
CONFIGS = [(mode, *rest) for mode in ("LSTM", "GRU") for rest in
           [(1, False, True, False), (2, True, False, True), (3, True, True, True), (2, False, False, False)]]
PACKED = [(mode, 2, True, bf, init) for mode in ("LSTM", "GRU") for bf, init in [(True, False), (False, True)]]
# LSTM(proj_size=3): (layers, bidirectional, batch_first, initial_state, packed)
PROJECTED = [(1, False, True, False, False), (2, True, False, True, False), (2, True, True, False, True),
             (1, False, False, True, True)]


def _inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, F_IN, generator=g), lengths


def _check(proto, model, packed):
    for seed, (B, T) in enumerate([(1, 23), (4, 50), (2, 9)], start=1):
        x, lengths = _inputs(B, T, seed)
        with torch.no_grad():
            expected = [t.numpy() for t in model(x, lengths)]
        got = run(proto, x.numpy(), lengths.numpy())
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and np.std(e) > 1e-3
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-4)
        if packed and B > 1:  # padded frames are zero, as pad_packed_sequence gives
            assert np.all(got[0][1, int(lengths[1]):] == 0) and lengths[1] < T


def _export(model, exporter):
    return export(model, _inputs(2, 37, 0), exporter, {0: {0: "batch", 1: "time"}, 1: {0: "batch"}})


def _build(config, packed=False, proj=0):
    torch.manual_seed(hash(config) % 1000)
    return Recurrent(*config, packed=packed, proj=proj).eval()


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_rnn_runs_at_any_length(config, exporter):
    model = _build(config)
    with onnx_compat.patched():
        proto = _export(model, exporter)
    _check(proto, model, packed=False)
    if exporter == "dynamo":
        assert {n.op_type for n in proto.graph.node} & {"LSTM", "GRU"}
        time_dim = proto.graph.output[0].type.tensor_type.shape.dim[1]
        assert time_dim.HasField("dim_param"), "the declared output time dim is static"


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("config", PACKED, ids=lambda c: "-".join(map(str, c)))
def test_packed_sequences(config, exporter):
    model = _build(config, packed=True)
    with onnx_compat.patched():
        proto = _export(model, exporter)
    _check(proto, model, packed=True)


@pytest.mark.skipif(not HAS_DYNAMO, reason="dynamo exporter only")
def test_vanilla_dynamo_fails_where_the_patches_help():
    time_first = _build(("LSTM", 1, False, False, False))
    if not versions.torch_at_least(DYNAMO_WRITES_RNN):  # from there on torch keeps T dynamic itself
        with pytest.raises(Exception):  # T baked: ORT fails or the shapes differ at other T
            _check(_export(time_first, "dynamo"), time_first, packed=False)
    with pytest.raises(Exception, match="zeros|FakeTensor"):
        _export(_build(PACKED[0], packed=True), "dynamo")


@pytest.mark.skipif(not HAS_DYNAMO, reason="dynamo exporter only")
def test_two_rnn_exports_in_one_process():
    for config in [("GRU", 1, False, False, False), ("LSTM", 2, True, False, False)]:
        model = _build(config)
        with onnx_compat.patched():
            proto = _export(model, "dynamo")
        _check(proto, model, packed=False)


@pytest.mark.skipif("rnn_dynamic_time" in onnx_compat.unavailable_patches(),
                    reason="rnn_dynamic_time needs a newer torch here (see available_patches)")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("config", PROJECTED, ids=lambda c: "-".join(map(str, c)))
def test_lstm_with_projection(config, exporter):
    """LSTMP: a loop over time (Scan from dynamo, Loop from TorchScript), packed input too."""
    *options, packed = config
    model = _build(("LSTM", *options), packed=packed, proj=3)
    with onnx_compat.patched():
        proto = _export(model, exporter)
    _check(proto, model, packed=packed)
    assert {n.op_type for n in proto.graph.node} & {"Scan", "Loop"}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_vanilla_lstm_with_projection_fails(exporter):
    """Without the patch neither exporter writes an LSTMP, so the test above cannot pass by accident."""
    model = _build(("LSTM", 1, False, True, False), proj=3)
    try:
        _check(_export(model, exporter), model, packed=False)
    except Exception as exc:  # torch's refusal, or a graph that is wrong at other sizes
        message = str(exc)
    else:
        pytest.fail("vanilla export of LSTM(proj_size) worked: the patch should step aside on this torch")
    expected = {"torchscript": "proj", "dynamo": "LSTM"}[exporter]
    assert expected in message, message[:400]


def test_lstm_projection_eager_matches_the_module():
    """The loop's own formulas against nn.LSTM(proj_size), every option, packed and not, without exporting."""
    from onnx_compat.patches._lstm_projection import lstm_projected
    for layers, bidirectional, bias in [(1, False, True), (2, True, True), (2, True, False)]:
        torch.manual_seed(layers)
        rnn = nn.LSTM(F_IN, HIDDEN, layers, bidirectional=bidirectional, bias=bias, proj_size=2).eval()
        x, lengths = _inputs(3, 12, 4)
        lengths[1] = 5
        seq = x.transpose(0, 1)
        states = layers * (2 if bidirectional else 1)
        hx = (torch.randn(states, 3, 2), torch.randn(states, 3, HIDDEN))
        with torch.no_grad():
            y, (h, c) = rnn(seq, hx)
            torch.testing.assert_close(lstm_projected(rnn, seq, None, hx, False), (y, (h, c)))
            packed = pack_padded_sequence(seq, lengths, enforce_sorted=False)
            y, (h, c) = rnn(packed, hx)
            y, _ = pad_packed_sequence(y, total_length=12)
            torch.testing.assert_close(lstm_projected(rnn, seq, lengths, hx, False), (y, (h, c)))


def test_eager_rnn_inside_patched_is_unchanged():
    model = _build(CONFIGS[1], packed=False)
    x, lengths = _inputs(3, 11, 0)
    expected = model(x, lengths)
    with onnx_compat.patched():
        got = model(x, lengths)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.skipif(not HAS_DYNAMO, reason="dynamo exporter only")
def test_custom_op_eager_matches_the_module():
    """The op's own implementation (used if anything runs it eagerly) equals nn.LSTM with packing."""
    model = _build(PACKED[1], packed=True)
    x, lengths = _inputs(3, 12, 4)
    lengths[1] = 5
    seq = x.transpose(0, 1)
    h0 = torch.randn(model.states, 3, HIDDEN)
    with torch.no_grad():
        packed = pack_padded_sequence(seq, lengths, enforce_sorted=False)
        y, (h, c) = model.rnn(packed, (h0, h0))
        y, _ = pad_packed_sequence(y, total_length=12)
        got = torch.ops.onnx_compat.rnn_packed(seq, lengths, [h0, h0], list(model.rnn._flat_weights), "LSTM",
                                               2, True, False, True)
    for a, b in zip(got, (y, h, c)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_blstm_through_the_pipeline_fits_rasr(exporter, tmp_path):
    job = blstm.build(features=10, classes=7, hidden=16)
    path = str(tmp_path / "blstm.onnx")
    report = pipeline_export(job["model"], path, job["inputs"], job["outputs"], exporter=exporter, rasr=True)
    assert report.rasr["ok"] and "feature-scorer" in report.rasr["roles"]
    assert check_rasr(path).ok
    out = onnx.load(path).graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in out[:2]] == ["batch", "time"]
    assert os.path.getsize(path) > 0
