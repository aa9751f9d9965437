"""Streaming export: steps with their states as named inputs/outputs, proven by running the stream.

Every numeric check here runs the written ONNX file the way a runtime does (its
initial states built from the metadata contract alone, state outputs fed back
as inputs) for more chunks and at other batch sizes than the pipeline's own
check, and compares with the unpatched eager model: its stream and its full
forward.
"""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from onnx_compat import Dim, TensorSpec
from onnx_compat.models import lstm_encoder, streaming_conformer
from onnx_compat.streaming import (NotStreamable, StateSpec, StreamingError, StreamMismatch, export_streaming,
                                   streamify)
from onnx_compat.testing import assert_not_degenerate

from helpers import EXPORTERS

B = Dim("batch")


# ---------------------------------------------------------------- a runtime's loop, from the metadata alone

def _initial_states(proto: onnx.ModelProto, batch: int):
    """What a runtime builds from ``streaming.states``: zeros (or the constant) at each declared shape."""
    meta = {p.key: p.value for p in proto.metadata_props}
    states = json.loads(meta["streaming.states"])
    out = {}
    for s in states:
        shape = [batch if d == "batch" else (0 if isinstance(d, str) else d) for d in s["dims"]]
        fill = 0 if s["init"] in ("zeros", "empty") else float(s["init"].split(":")[1])
        out[s["name"]] = (np.full(shape, fill, dtype=s["dtype"]), s["output"])
    return meta, out


def runtime_stream(path: str, data: np.ndarray, first_output: str):
    """Run ``path`` over ``data`` [B, T, F] chunk by chunk; the concatenated first output and the final states."""
    proto = onnx.load(path)
    meta, states = _initial_states(proto, data.shape[0])
    chunk, shift = int(meta["streaming.chunk_size"]), int(meta["streaming.chunk_shift"])
    assert {f"STATE_{k}": v[1] for k, v in states.items()}.items() <= meta.items()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    input_name = sess.get_inputs()[0].name
    pieces, values = [], {k: v for k, (v, _) in states.items()}
    for start in range(0, data.shape[1] - chunk + 1, shift):
        feeds = {input_name: data[:, start:start + chunk], **values}
        names = [first_output] + [out for _, out in states.values()]
        got = sess.run(names, feeds)
        pieces.append(got[0])
        values = dict(zip(states, got[1:]))
    return np.concatenate(pieces, axis=1), values


def eager_stream(job, data: torch.Tensor, chunk: int):
    """The same loop on the unpatched eager step (zeros to start)."""
    states = [s.initial({"batch": data.shape[0]}) for s in job["states"]]
    pieces = []
    with torch.no_grad():
        for start in range(0, data.shape[1] - chunk + 1, chunk):
            out, *states = job["step"](data[:, start:start + chunk], *states)
            pieces.append(out)
    return torch.cat(pieces, 1), states


def assert_streams(path, job, chunk, batch, chunks, seed=5):
    torch.manual_seed(seed)
    data = torch.randn(batch, chunk * chunks, job["inputs"][0].dims[-1])
    got, final = runtime_stream(path, data.numpy(), job["outputs"][0].name)
    with torch.no_grad():
        full = job["full_forward"](data)
    streamed, states = eager_stream(job, data, chunk)
    where = f"at B={batch}, {chunks} chunks of {chunk}"
    assert_not_degenerate(full.numpy(), f"full forward {where}")
    np.testing.assert_allclose(got, full.numpy(), atol=2e-5, rtol=1e-4, err_msg=f"ONNX stream vs full forward {where}")
    np.testing.assert_allclose(streamed.numpy(), full.numpy(), atol=2e-5, rtol=1e-4,
                               err_msg=f"eager stream vs full forward {where}")
    for spec, value in zip(job["states"], states):
        np.testing.assert_allclose(final[spec.name], value.numpy(), atol=2e-5, rtol=1e-4,
                                   err_msg=f"final state {spec.name} {where}")


# ---------------------------------------------------------------- the reference models

REFERENCE = {
    "lstm": lambda: lstm_encoder.streaming_job(chunk=8),
    "conformer": lambda: streaming_conformer.streaming_job(dim=16, layers=2, chunk=8, left_chunks=2),
}


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_model_streams(tmp_path, name, exporter):
    job = REFERENCE[name]()
    path = str(tmp_path / f"{name}.onnx")
    report = export_streaming(job["step"], path, job["inputs"], job["states"], job["outputs"],
                              full_forward=job["full_forward"], exporter=exporter)
    assert report.exporter == exporter and os.path.exists(path)
    # the pipeline's own check: two batch sizes, >= 5 chunks, every output and state compared, drift from full
    assert [e["sizes"]["batch"] for e in report.verification] == [1, 3]
    assert all(e["sizes"]["chunks"] >= 5 and e["ok"] for e in report.verification)
    compared = {o["name"] for o in report.verification[0]["outputs"]}
    assert compared == {"output"} | {s.output for s in job["states"]}
    assert all(e["drift"]["output"] < 1e-5 and e["drift_eager"]["output"] < 1e-5 for e in report.verification)
    assert not report.degenerate
    meta = report.metadata
    assert meta["streaming.chunk_size"] == "8" and meta["streaming.chunk_shift"] == "8"
    assert [s["name"] for s in json.loads(meta["streaming.states"])] == [s.name for s in job["states"]]
    # the written file, run as a runtime would from its metadata: other batch sizes, more chunks
    for batch, chunks in ((1, 7), (4, 5)):
        assert_streams(path, job, 8, batch, chunks)


def test_conformer_stream_is_its_masked_full_forward():
    """The reference is built to be exact: eager stream == full forward with the chunked mask, odd lengths too."""
    job = streaming_conformer.streaming_job(dim=16, chunk=4, left_chunks=1)
    data = torch.randn(2, 4 * 6, 20)
    streamed, _ = eager_stream(job, data, 4)
    with torch.no_grad():
        full = job["full_forward"](data)
        unmasked = job["full_forward"].blocks[0](job["full_forward"].input(data), torch.ones(24, 24, dtype=torch.bool))
    assert torch.allclose(streamed, full, atol=1e-5), float((streamed - full).abs().max())
    masked = job["full_forward"].blocks[0](job["full_forward"].input(data),
                                           streaming_conformer.chunk_mask(24, 4, 1))
    assert (unmasked - masked).abs().max() > 1e-3, "the chunk mask must matter, or the test proves nothing"


def test_lstm_metadata_and_report_json(tmp_path):
    job = lstm_encoder.streaming_job(chunk=4)
    path = str(tmp_path / "lstm.onnx")
    report = export_streaming(job["step"], path, job["inputs"], job["states"], job["outputs"],
                              exporter="torchscript", right_context=0, metadata={"model_type": "lstm"})
    props = {p.key: p.value for p in onnx.load(path).metadata_props}
    states = json.loads(props["streaming.states"])
    assert states[0] == {"name": "h", "output": "new_h", "dims": [2, "batch", 32], "dtype": "float32",
                         "path": "state argument 0", "shape_batch1": [2, 1, 32], "init": "zeros"}
    assert props["STATE_c"] == "new_c" and props["model_type"] == "lstm" and props["streaming.right_context"] == "0"
    assert json.loads(report.to_json())["metadata"]["streaming.states"] == props["streaming.states"]


# ---------------------------------------------------------------- a decoder whose cache grows

class Decoder(nn.Module):
    """One attention layer over all past tokens: its K/V cache grows by the chunk on every call."""

    def __init__(self, vocab=20, dim=16):
        super().__init__()
        self.embed, self.qkv, self.out = nn.Embedding(vocab, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, vocab)

    def _attend(self, q, k, v, offset):
        pos_q, pos_k = offset + torch.arange(q.shape[1]), torch.arange(k.shape[1])
        scores = (q @ k.transpose(1, 2)).masked_fill(pos_k[None, None, :] > pos_q[None, :, None], float("-inf"))
        return self.out(scores.softmax(-1) @ v)

    def forward(self, tokens):
        q, k, v = self.qkv(self.embed(tokens)).chunk(3, -1)
        return self._attend(q, k, v, 0)

    def step(self, tokens, past_k, past_v):
        q, k, v = self.qkv(self.embed(tokens)).chunk(3, -1)
        k, v = torch.cat([past_k, k], 1), torch.cat([past_v, v], 1)
        return self._attend(q, k, v, past_k.shape[1]), k, v


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_decoder_cache_grows_along_past(tmp_path, exporter):
    torch.manual_seed(0)
    model, past = Decoder().eval(), Dim("past")
    path = str(tmp_path / "decoder.onnx")
    report = export_streaming(model.step, path, [TensorSpec("tokens", [B, 2], torch.int64, values=(0, 20))],
                              [StateSpec("past_k", [B, past, 16]), StateSpec("past_v", [B, past, 16])],
                              [TensorSpec("logits", [B, 2, 20])], full_forward=model, exporter=exporter)
    assert all(e["drift"]["logits"] < 1e-5 for e in report.verification), report.verification
    states = json.loads(report.metadata["streaming.states"])
    assert states[0]["init"] == "empty" and states[0]["grows"] == "past" and states[0]["shape_batch1"] == [1, 0, 16]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    tokens = torch.randint(0, 20, (3, 14))
    k = v = np.zeros((3, 0, 16), np.float32)
    pieces = []
    for start in range(0, 14, 2):
        logits, k, v = sess.run(None, {"tokens": tokens[:, start:start + 2].numpy(), "past_k": k, "past_v": v})
        pieces.append(logits)
    assert k.shape == (3, 14, 16)
    with torch.no_grad():
        np.testing.assert_allclose(np.concatenate(pieces, 1), model(tokens).numpy(), atol=1e-5,
                                   err_msg="decoder stream vs full forward at B=3, 7 chunks of 2")


# ---------------------------------------------------------------- streamify

class Chomp(nn.Module):
    def __init__(self, amount):
        super().__init__()
        self.amount = amount

    def forward(self, x):
        return x[:, :, :-self.amount].contiguous()


class CausalNet(nn.Module):
    """Causal conv by F.pad (dilated), causal conv by padding + chomp, eval BatchNorm, a 2-layer LSTM."""

    def __init__(self, features=10, channels=16, hidden=12, classes=5):
        super().__init__()
        self.inp = nn.Linear(features, channels)
        self.conv1 = nn.Conv1d(channels, channels, 3, dilation=2)
        self.conv2 = nn.Conv1d(channels, channels, 4, padding=3)
        self.chomp = Chomp(3)
        self.bn = nn.BatchNorm1d(channels)
        self.lstm = nn.LSTM(channels, hidden, 2, batch_first=True)
        self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        y = self.inp(x).relu().transpose(1, 2)
        y = F.gelu(self.conv1(F.pad(y, (4, 0)))) + y
        y = self.bn(self.chomp(self.conv2(y)))
        y, _ = self.lstm(y.transpose(1, 2))
        return self.out(self.norm(y)).log_softmax(-1)


def _causal_net():
    torch.manual_seed(0)
    model = CausalNet().eval()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2.0)
    return model


def test_streamify_reproduces_the_full_forward_exactly(tmp_path):
    model = _causal_net()
    step = streamify(model)
    assert [(s.name, s.describe()["dims"]) for s in step.states] == [
        ("conv1_cache", ["batch", 16, 4]), ("conv2_cache", ["batch", 16, 3]),
        ("lstm_h", [2, "batch", 12]), ("lstm_c", [2, "batch", 12])]
    x = torch.randn(3, 23, 10)
    with torch.no_grad():
        full = model(x)
        states, pieces, start = step.init_states(3), [], 0
        for size in (1, 7, 3, 8, 4):  # uneven chunks, one frame included
            out, *states = step(x[:, start:start + size], *states)
            pieces.append(out)
            start += size
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-6), "streamed in chunks 1,7,3,8,4 at B=3"
    path = str(tmp_path / "causal.onnx")
    job = {"step": step, "states": step.states, "inputs": [TensorSpec("data", [B, 8, 10])],
           "outputs": [TensorSpec("output", [B, 8, 5])], "full_forward": model}
    report = export_streaming(step, path, job["inputs"], step.states, job["outputs"], full_forward=model,
                              exporter="torchscript")
    assert all(e["drift"]["output"] < 1e-5 for e in report.verification)
    assert_streams(path, job, 8, batch=2, chunks=6)


class _Bidirectional(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(10, 8, batch_first=True, bidirectional=True)

    def forward(self, x):
        return self.rnn(x)[0]


class _Symmetric(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.conv = nn.Linear(10, 6), nn.Conv1d(6, 6, 3, padding=1)

    def forward(self, x):
        return self.conv(self.inp(x).transpose(1, 2)).transpose(1, 2)


class _RightPad(_Symmetric):
    def forward(self, x):
        return F.conv1d(F.pad(self.inp(x).transpose(1, 2), (1, 1)), self.conv.weight)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.attention = nn.Linear(10, 8), nn.MultiheadAttention(8, 2, batch_first=True)
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        y = self.inp(x)
        return self.lstm(self.attention(y, y, y)[0])[0]


class _TimeNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.conv, self.norm = nn.Linear(10, 8), nn.Conv1d(8, 8, 2), nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.norm(self.conv(F.pad(self.inp(x).transpose(1, 2), (1, 0))))


@pytest.mark.parametrize("model, module, words", [
    (_Bidirectional, "rnn", "bidirectional"),
    (_Symmetric, "conv", "not causal"),
    (_Attention, "attention", "attention without a declared left context"),
    (_TimeNorm, "norm", "mixes frames across time"),
    (_RightPad, "pad", "mixes frames across time"),
])
def test_streamify_refuses_naming_the_module(model, module, words):
    with pytest.raises(NotStreamable, match=words) as err:
        streamify(model())
    assert err.value.module == module


# ---------------------------------------------------------------- bad input and the patterns of item 4

F_IN = 6


class _Step(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(F_IN, F_IN)


def _export(tmp_path, step, states, exporter="torchscript", **kwargs):
    path = str(tmp_path / "step.onnx")
    report = export_streaming(step, path, [TensorSpec("data", [B, 4, F_IN])], states,
                              [TensorSpec("output", [B, 4, F_IN])], exporter=exporter, **kwargs)
    return path, report


class _Unpaired(_Step):
    def step(self, x, h, c):
        y = self.lin(x) + h
        return y, y[:, -1:]


class _Extra(_Step):
    def step(self, x, h):
        y = self.lin(x) + h
        return y, y[:, -1:], y[:, -1:]


class _Growing(_Step):
    def step(self, x, h):
        return self.lin(x) + h.mean(1, keepdim=True), torch.cat([h, x], 1)


class _Refuses(_Step):
    def step(self, x, h):
        if x.shape[1] % 3:
            raise ValueError(f"chunks must be a multiple of 3 frames, got {x.shape[1]}")
        return self.lin(x), h


class _Counter(_Step):
    def __init__(self):
        super().__init__()
        self.frames = 0

    def step(self, x, h):
        self.frames += x.shape[1]
        return self.lin(x) + h + self.frames, h + 1


class _BufferCache(_Step):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 1, F_IN))

    def step(self, x, h):
        self.cache.add_(x.mean((0, 1), keepdim=True))
        return self.lin(x) + self.cache + h, h + 1


@pytest.mark.parametrize("make, states, field, value, words", [
    (_Unpaired, lambda: [StateSpec("h", [B, 1, F_IN]), StateSpec("c", [B, 1, F_IN])], "state", "c", "no paired output"),
    (_Extra, lambda: [StateSpec("h", [B, 1, F_IN])], "state", "h", "1 more than"),
    (_Growing, lambda: [StateSpec("h", [B, 2, F_IN])], "state", "h", "changes between calls"),
    (_Refuses, lambda: [StateSpec("h", [B, 1, F_IN])], "chunk", 4, "refuses a chunk of 4 frames"),
    (_Counter, lambda: [StateSpec("h", [B, 1, F_IN])], "attribute", "frames", "frozen into the graph"),
    (_BufferCache, lambda: [StateSpec("h", [B, 1, F_IN])], "attribute", "cache", "pass it in and return it"),
])
def test_bad_steps_are_refused_before_anything_is_written(tmp_path, make, states, field, value, words):
    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(StreamingError, match=words) as err:
        _export(tmp_path, model.step, states())
    assert getattr(err.value, field) == value
    assert os.listdir(tmp_path) == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert getattr(model, "frames", 0) == 0


def test_declarations_are_checked(tmp_path):
    with pytest.raises(StreamingError, match="used more than once") as err:
        _export(tmp_path, _Step().lin, [StateSpec("h", [B, 1]), StateSpec("new_h", [B, 1])])
    assert err.value.state in ("h", "new_h")
    with pytest.raises(StreamingError, match="also a declared input or output") as err:
        _export(tmp_path, _Step().lin, [StateSpec("output", [B, 1])])
    assert err.value.state == "output"
    with pytest.raises(StreamingError, match="state 'h' starts empty along 'B'") as err:  # the batch misnamed
        _export(tmp_path, _Unpaired().step, [StateSpec("h", [Dim("B"), 1, F_IN]), StateSpec("c", [Dim("B"), 1, F_IN])])
    assert err.value.state == "h"
    with pytest.raises(StreamingError, match="chunk=5 but input 'data' declares 4"):
        _export(tmp_path, _Unpaired().step, [StateSpec("h", [B, 1, F_IN])], chunk=5)
    assert os.listdir(tmp_path) == []


class _Unread(_Step):
    """Reads its state through float(): a trace freezes the number and drops the input."""

    def step(self, x, last):
        return self.lin(x) + float(last.sum()), x[:, -1:].clone()


class _HiddenUpdate(_Step):
    """Updates its cache through ``.numpy()``, which a trace does not record: the graph returns it unchanged."""

    def step(self, x, cache):
        cache.numpy()[:] = torch.cat([cache, x], 1)[:, -2:].numpy()
        return self.lin(x) + cache.sum(1, keepdim=True), cache


@pytest.mark.parametrize("make, state, words", [
    (_Unread, "last", "the graph ignores this input"),
    (_HiddenUpdate, "cache", "returns it unchanged"),
])
def test_a_state_the_graph_loses_is_named(tmp_path, make, state, words):
    with pytest.raises(StreamMismatch, match=words) as err:
        _export(tmp_path, make().step, [StateSpec(state, [B, 1 if state == "last" else 2, F_IN])])
    assert err.value.state == state
    assert os.listdir(tmp_path) == []


class _InPlace(_Step):
    def step(self, x, cache):
        y = self.lin(x) + cache.mean(1, keepdim=True)
        cache[:, :] = x[:, -2:]
        return y, cache


def test_in_place_cache_update_is_fixed(tmp_path):
    path, report = _export(tmp_path, _InPlace().step, [StateSpec("cache", [B, 2, F_IN])])
    assert any("in place" in r and "cache" in r for r in report.repairs)
    assert all(e["ok"] for e in report.verification)


class _ItemSlice(_Step):
    """Emformer's pattern: how many cached frames are valid is read with .item() from a counter state."""

    def step(self, x, cache, seen):
        valid = int(seen.item())
        y = self.lin(x) + cache[:, max(0, 8 - valid):].sum(1, keepdim=True) / max(valid, 1)
        return y, torch.cat([cache, x], 1)[:, -8:], seen + x.shape[1]


def test_item_sliced_cache_is_refused_by_a_trace(tmp_path):
    states = [StateSpec("cache", [B, 8, F_IN]), StateSpec("seen", [1], torch.int64)]
    with pytest.raises(StreamMismatch, match=r"froze a value .*state 'seen' is read as a Python value \(\.item\(\) at "
                       + r".*test_streaming.py:\d+\)") as err:
        _export(tmp_path, _ItemSlice().step, states)
    assert err.value.chunk is not None and err.value.output == "output" and err.value.state == "seen"
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="no dynamo exporter in this torch")
def test_item_sliced_cache_streams_through_dynamo(tmp_path):
    """dynamo keeps the number symbolic: the same step streams right, and the report says what a trace would do."""
    states = [StateSpec("cache", [B, 8, F_IN]), StateSpec("seen", [1], torch.int64)]
    _, report = _export(tmp_path, _ItemSlice().step, states, exporter="auto")
    assert report.exporter == "dynamo" and all(e["ok"] for e in report.verification)
    assert any("state 'seen' is read as a Python value (.item()" in f for f in report.findings)


class _NoneFirst(_Step):
    def step(self, x, h):
        if h is None:
            h = torch.zeros(x.shape[0], 1, F_IN)
        y = self.lin(x) + h
        return y, y[:, -1:]


def test_none_on_the_first_call(tmp_path):
    _, report = _export(tmp_path, _NoneFirst().step, [StateSpec("h", [B, 1, F_IN])], none_first=True)
    assert all(e["ok"] for e in report.verification)
    with pytest.raises(StreamMismatch, match="not what None means") as err:
        _export(tmp_path, _NoneFirst().step, [StateSpec("h", [B, 1, F_IN], init=1.0)], none_first=True)
    assert err.value.chunk == 0


class _Nested(_Step):
    """States as one List[List[Tensor]] argument, as torchaudio's Emformer takes them."""

    def step(self, x, states):
        y, out = self.lin(x), []
        for memory, count in states:
            y = y + memory
            out.append([y[:, -1:], count + 1])
        return y, out


def test_nested_states_are_flattened_with_their_paths(tmp_path):
    layer = lambda i: [StateSpec(f"memory{i}", [B, 1, F_IN]), StateSpec(f"count{i}", [1], torch.int64)]  # noqa: E731
    path, report = _export(tmp_path, _Nested().step, [[layer(0), layer(1)]],
                           init_states=lambda batch: [[torch.zeros(batch, 1, F_IN), torch.zeros(1, dtype=torch.int64)]
                                                      for _ in range(2)])
    states = json.loads(report.metadata["streaming.states"])
    assert [(s["name"], s["path"]) for s in states] == [
        ("memory0", "states0[0][0]"), ("count0", "states0[0][1]"), ("memory1", "states0[1][0]"),
        ("count1", "states0[1][1]")]
    assert [i.name for i in onnx.load(path).graph.input] == ["data", "memory0", "count0", "memory1", "count1"]


# ---------------------------------------------------------------- CLI function (wired into onnx-compat by the lead)

def _cli(argv):
    import argparse
    from onnx_compat.streaming import cli
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return cli.run(parser.parse_args(["export-streaming"] + argv))


def test_cli_exports_a_factory(tmp_path, capsys):
    out, report = tmp_path / "lstm.onnx", tmp_path / "report.json"
    assert _cli(["onnx_compat.models.lstm_encoder:streaming_job", "--out", str(out), "--exporter", "torchscript",
                 "--json", str(report), "--batch", "1", "--batch", "2", "--chunks", "5"]) == 0
    printed = capsys.readouterr().out
    assert "drift       {'batch': 2, 'chunks': 5}" in printed
    saved = json.loads(report.read_text())
    assert [e["sizes"]["batch"] for e in saved["verification"]] == [1, 2]
    assert "streaming.states" in {p.key for p in onnx.load(str(out)).metadata_props}


def test_cli_factory_errors(tmp_path):
    from onnx_compat.streaming.cli import FactoryError
    with pytest.raises(FactoryError, match="must return a dict with"):
        _cli(["onnx_compat.models.blstm:build", "--out", str(tmp_path / "x.onnx")])
    assert os.listdir(tmp_path) == []


class _WithLengths(_Step):
    def step(self, h, x=None, lengths=None):
        y = self.lin(x) + h
        return y, lengths, y[:, -1:]


def test_chunk_with_lengths_by_keyword(tmp_path):
    """The RETURNN convention in a stream: data + data:size1 in, output + output:size1 out, a dynamic chunk."""
    time = Dim("time")
    path = str(tmp_path / "step.onnx")
    report = export_streaming(_WithLengths().step, path,
                              [TensorSpec("data", [B, time, F_IN], lengths=[1], arg="x", length_args={1: "lengths"})],
                              [StateSpec("h", [B, 1, F_IN], output="h_next")],
                              [TensorSpec("output", [B, time, F_IN], lengths=[1])], exporter="torchscript", chunk=4)
    graph = onnx.load(path).graph
    assert [i.name for i in graph.input] == ["data", "data:size1", "h"]
    assert [o.name for o in graph.output] == ["output", "output:size1", "h_next"]
    assert report.metadata["STATE_h"] == "h_next"
    assert report.verification[1]["sizes"] == {"batch": 3, "time": 4, "chunks": 6} and not report.degenerate


class _ConvFirst(nn.Module):
    """Time last from the start ([B, F, T]): a causal conv by F.pad, then a GRU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(10, 8, 3)
        self.gru = nn.GRU(8, 6, batch_first=True)

    def forward(self, x):
        return self.gru(torch.tanh(self.conv(F.pad(x, (2, 0)))).transpose(1, 2))[0]


def test_streamify_time_last_input_and_gru():
    torch.manual_seed(0)
    model = _ConvFirst().eval()
    step = streamify(model, time_axis=2)
    assert [s.name for s in step.states] == ["conv_cache", "gru_h"]
    x = torch.randn(2, 10, 12)
    with torch.no_grad():
        out1, *states = step(x[:, :, :5], *step.init_states(2))
        out2, *_ = step(x[:, :, 5:], *states)
        assert torch.allclose(torch.cat([out1, out2], 1), model(x), atol=1e-6), "chunks of 5 and 7 frames at B=2"


class _Lookahead(_Step):
    """A centred conv: one frame of history (the state) and one of look-ahead (the right context)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(F_IN, F_IN, 3)

    def forward(self, x):
        return self.conv(F.pad(x.transpose(1, 2), (1, 1))).transpose(1, 2)

    def step(self, x, previous):  # x: the 4 frames of this call, then 1 of look-ahead
        joined = torch.cat([previous, x], 1)
        return self.conv(joined.transpose(1, 2)).transpose(1, 2), x[:, -2:-1]


def test_right_context(tmp_path):
    model = _Lookahead().eval()
    path = str(tmp_path / "lookahead.onnx")
    report = export_streaming(model.step, path, [TensorSpec("data", [B, 5, F_IN])], [StateSpec("previous", [B, 1, F_IN])],
                              [TensorSpec("output", [B, 4, F_IN])], right_context=1, full_forward=model,
                              exporter="torchscript")
    assert report.metadata["streaming.chunk_size"] == "5" and report.metadata["streaming.chunk_shift"] == "4"
    assert report.metadata["streaming.right_context"] == "1"
    assert all(e["drift"]["output"] < 1e-5 for e in report.verification), report.verification
    x = torch.randn(2, 4 * 6 + 1, F_IN)  # six calls: 4 new frames each, the last call's look-ahead at the end
    got, _ = runtime_stream(path, x.numpy(), "output")
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x)[:, :24].numpy(), atol=1e-5, err_msg="B=2, 6 calls of 4 + 1 frames")


def test_initial_values_from_a_function_go_into_the_metadata(tmp_path):
    """A runtime cannot call init_states: small per-item values are written for it; batch-dependent ones are not."""
    start = torch.linspace(-1.0, 1.0, F_IN).reshape(1, 1, F_IN)
    _, report = _export(tmp_path, _NoneFirst().step, [StateSpec("h", [B, 1, F_IN])],
                        init_states=lambda batch: [start.repeat(batch, 1, 1)])
    state = json.loads(report.metadata["streaming.states"])[0]
    assert state["init"] == "values" and state["values"] == start.tolist()
    _, report = _export(tmp_path, _NoneFirst().step, [StateSpec("h", [B, 1, F_IN])],
                        init_states=lambda batch: [torch.arange(batch * F_IN, dtype=torch.float32).reshape(batch, 1, F_IN)])
    state = json.loads(report.metadata["streaming.states"])[0]
    assert state["init"] == "custom" and "values" not in state


def test_drift_beyond_the_default_tolerance_is_an_error(tmp_path):
    """A full forward with other weights than the step drifts: an error by default (max_drift=None), a number
    overrides the default, math.inf turns the check off; the summary shows the drift either way."""
    import math
    torch.manual_seed(0)
    model, other = _Lookahead().eval(), _Lookahead().eval()
    with torch.no_grad():
        other.conv.weight.mul_(1.5)  # the full forward has other weights than the step
    path = str(tmp_path / "lookahead.onnx")
    args = ([TensorSpec("data", [B, 5, F_IN])], [StateSpec("previous", [B, 1, F_IN])],
            [TensorSpec("output", [B, 4, F_IN])])
    kwargs = dict(right_context=1, full_forward=other, exporter="torchscript")
    with pytest.raises(StreamMismatch, match=r"^output 'output': the concatenated stream drifts .* from the full "
                                             r"forward \(max_drift=None: the default 1e-3\).*math.inf") as raised:
        export_streaming(model.step, path, *args, **kwargs)
    assert raised.value.output == "output" and not os.path.exists(path)
    with pytest.raises(StreamMismatch, match=r"max_drift=0.001\)"):
        export_streaming(model.step, path, *args, max_drift=1e-3, **kwargs)
    report = export_streaming(model.step, path, *args, max_drift=math.inf, **kwargs)
    assert all(e["drift"]["output"] > 0.01 for e in report.verification)
    assert "drift       " in report.summary()
    report = export_streaming(model.step, path, *args, right_context=1, full_forward=model, exporter="torchscript")
    lines = [line for line in report.summary().splitlines() if line.startswith("drift")]
    assert len(lines) == len(report.verification) and "output" in lines[0], report.summary()


class _InPlaceStep(_Step):
    """Writes into its chunk input: the eager stream and the graph's must still be fed the same values."""

    def forward(self, x):
        return self.lin(x * 2.0)

    def step(self, x, previous):
        x *= 2.0
        y = self.lin(x) + previous
        return y, y[:, -1:]


def test_a_step_that_writes_into_its_input_streams(tmp_path):
    model = _InPlaceStep().eval()
    path, report = _export(tmp_path, model.step, [StateSpec("previous", [B, 1, F_IN])])
    assert len(report.verification) == 2 and all(e["ok"] for e in report.verification)


class _LstmState(nn.Module):
    """An LSTM's states are [layers, batch, hidden]; at example batch 2 with 2 layers, [batch, 2, 32] fits too."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(F_IN, 32, 2, batch_first=True)
        self.out = nn.Linear(32, F_IN)

    def step(self, x, h, c):
        y, (h, c) = self.lstm(x, (h, c))
        return self.out(y), h, c


def test_a_state_with_its_batch_on_the_wrong_axis_is_named(tmp_path):
    """The eager pre-pass runs at a second batch size: the state whose declared batch axis the step does not
    use is named, with the axis it does use, before any exporter runs (nothing blamed on torch's rnn.py)."""
    step = _LstmState().eval().step
    wrong = [StateSpec("h", [B, 2, 32]), StateSpec("c", [2, B, 32])]
    with pytest.raises(StreamingError) as raised:
        _export(tmp_path, step, wrong, exporter="auto")
    message = str(raised.value)
    assert raised.value.state == "h" and "axis 0" in message and "axis 1" in message, message
    assert "rnn.py" not in message and not os.path.exists(tmp_path / "step.onnx")
    path, report = _export(tmp_path, step, [StateSpec("h", [2, B, 32]), StateSpec("c", [2, B, 32])])
    assert all(e["ok"] for e in report.verification)


def test_messages_name_what_the_user_got_wrong(tmp_path):
    """A state the step takes but nobody declared is named as that state (not the first declared one);
    right_context as large as the chunk is said as such (no shift=0 the user never set)."""
    step = _LstmState().eval().step  # step(x, h, c)
    with pytest.raises(StreamingError) as raised:
        _export(tmp_path, step, [StateSpec("h", [2, B, 32])])
    assert raised.value.state == "c" and "'c'" in str(raised.value) and "'h'" not in str(raised.value), raised.value
    with pytest.raises(StreamingError) as raised:
        export_streaming(_Lookahead().eval().step, str(tmp_path / "l.onnx"), [TensorSpec("data", [B, 5, F_IN])],
                         [StateSpec("previous", [B, 1, F_IN])], [TensorSpec("output", [B, 4, F_IN])], right_context=5)
    message = str(raised.value)
    assert "right_context=5" in message and "chunk" in message and "shift" not in message, message
    assert not os.listdir(tmp_path)


def test_rasr_check_recognises_state_metadata(tmp_path):
    """inspect's RASR check of a streaming step: inputs paired by STATE_<input> metadata are fed by RASR from
    the previous call's output, not unmapped inputs; a STATE_ entry naming no output is a finding."""
    from onnx_compat.contracts.rasr import check_rasr
    path, _ = _export(tmp_path, _InPlaceStep().eval().step, [StateSpec("previous", [B, 1, F_IN])])
    findings = check_rasr(path, features_size=None).findings
    assert not any("previous" in f for f in findings), findings
    proto = onnx.load(path)
    next(p for p in proto.metadata_props if p.key == "STATE_previous").value = "nowhere"
    findings = check_rasr(proto, features_size=None).findings
    assert any("'STATE_previous' names output 'nowhere'" in f for f in findings), findings
