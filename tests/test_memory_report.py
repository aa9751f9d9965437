"""The export's own peak memory on the report (``pipeline/memory.py``), and the route that keeps it low: weights
kept in a file during the export (``pipeline/weights.py``), written inside the one ``.onnx`` at the end. The
figures against the weights' size are measured in ``benchmarks/model_size.py``, not asserted here."""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.external_data_helper import load_external_data_for_model
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.pipeline import memory, weights
from onnx_compat.testing import assert_not_degenerate

from helpers import EXPORTERS

SPECS = ([TensorSpec("data", [Dim("batch"), Dim("time"), 12])], [TensorSpec("out", [Dim("batch"), Dim("time"), 6])])


class Stack(nn.Module):
    """A conv, a shared weight (one initializer for two uses), a buffer and a norm: what the exporter's
    weights are made of."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(12, 32, 3, padding=1)
        self.norm = nn.LayerNorm(32)
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)
        self.b.weight = self.a.weight
        self.out = nn.Linear(32, 6)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 32))

    def forward(self, data):
        x = self.norm(self.conv(data.transpose(1, 2)).transpose(1, 2))
        return self.out(torch.relu(self.b(torch.relu(self.a(x)))) * self.scale + x)


def _model():
    torch.manual_seed(0)
    return Stack().eval()


def _run(path, data):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {"data": data.numpy()})[0]


def test_the_report_carries_the_exports_peak_memory(tmp_path):
    model = _model()
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript")
    peak = report.peak_memory
    assert peak["bytes"] > 0 and peak["weights_bytes"] == weights.weight_bytes(model) > 0, peak
    assert peak["over_weights"] == pytest.approx(peak["bytes"] / peak["weights_bytes"], rel=0.01), peak
    assert "capture (torchscript)" in peak["stages"] and max(peak["stages"].values()) <= peak["bytes"], peak
    assert json.loads(report.to_json())["peak_memory"] == peak
    line = next(x for x in report.summary().splitlines() if x.startswith("memory "))
    assert f"{peak['bytes'] / 2**20:.0f} MiB above the start" in line, line
    # a ratio to weights this small (under 16 MiB) would measure the exporters' working memory, not the weights
    assert ("x the weights" in line) == (peak["weights_bytes"] >= 16 * 2**20), line


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="the high-water mark is reset on Linux only")
def test_a_measurement_sees_what_happened_inside_it_nested_or_not():
    """A nested measurement (an export inside an export's stage) resets the mark: the outer one still sees
    the inner one's peak, and each stage holds its own."""
    size = 64 << 20
    with memory.PeakMemory() as outer:
        outer.stage("small")
        with memory.PeakMemory() as inner:
            held = np.ones(size, dtype=np.uint8)  # written, so resident
            del held
        outer.stage("after")
    inner_peak, outer_peak = inner.result(), outer.result()
    assert inner_peak.exact and inner_peak.above_start >= 0.9 * size, inner_peak
    assert outer_peak.above_start >= inner_peak.above_start + inner_peak.start - outer_peak.start, outer_peak
    assert outer_peak.stages["small"] >= 0.9 * size > outer_peak.stages["after"], outer_peak.stages
    assert memory.process_peak() >= inner_peak.start + inner_peak.above_start


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_weights_kept_on_disk_are_written_inside_one_file(exporter, monkeypatch, tmp_path):
    """The file route (every model here: the rule's size lowered to one byte) writes the same model as the
    in-memory route: one file, the same weights by name, verified, numbers as eager's at new sizes."""
    model = _model()
    memory_route = onnx_compat.export(model, str(tmp_path / "mem.onnx"), *SPECS, exporter=exporter)
    monkeypatch.setattr(weights, "ON_DISK_FROM", 1)
    committed, commit = [], weights.WeightsFolder.commit
    monkeypatch.setattr(weights.WeightsFolder, "commit", lambda self, proto: committed.append(self.beside) or
                        commit(self, proto))
    (tmp_path / "disk").mkdir()
    path = str(tmp_path / "disk" / "m.onnx")
    report = onnx_compat.export(model, path, *SPECS, exporter=exporter)
    assert committed == [False], "the weights were meant to stay in a file during the export"
    assert report.external_data is None and os.listdir(tmp_path / "disk") == ["m.onnx"]
    assert report.verified_elsewhere() == 3 and report.nodes == memory_route.nodes, report.summary()
    on_disk, in_memory = onnx.load(path), onnx.load(str(tmp_path / "mem.onnx"))
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in on_disk.graph.initializer)
    kept = {t.name: onnx.numpy_helper.to_array(t) for t in in_memory.graph.initializer}
    got = {t.name: onnx.numpy_helper.to_array(t) for t in on_disk.graph.initializer}
    assert got.keys() == kept.keys() and all(np.array_equal(got[k], kept[k]) for k in kept), sorted(got)
    onnx.checker.check_model(path, full_check=True)
    for batch, time in ((1, 9), (3, 41)):  # the export example is B=2; other sizes here
        data = torch.randn(batch, time, 12)
        with torch.no_grad():
            expected = model(data).numpy()
        out = _run(path, data)
        assert_not_degenerate(expected, f"B={batch} T={time}")
        assert np.allclose(out, expected, atol=1e-4, rtol=1e-3), \
            f"B={batch} T={time}: max abs err {np.abs(out - expected).max():.3g}"


def test_the_file_streamed_together_is_the_file_onnx_writes(tmp_path):
    """``write_inline``: the graph, then one piece per tensor, parses to the model ``onnx.save`` writes."""
    onnx_compat.export(_model(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript", external_data=True)
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    whole = onnx.load(str(tmp_path / "m.onnx"))
    weights.write_inline(proto, str(tmp_path), str(tmp_path / "one.onnx"))
    assert onnx.load(str(tmp_path / "one.onnx")).SerializeToString() == whole.SerializeToString()


def test_tensors_taken_into_the_file_keep_dtype_shape_and_bytes(tmp_path):
    tensors = {"f": torch.randn(3, 400), "h": torch.randn(600).to(torch.bfloat16), "i": torch.arange(300),
               "b": torch.tensor([True, False, True]), "s": torch.tensor(2.5), "t": torch.randn(20, 30).t()}
    graph = onnx.helper.make_graph([], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])]
                                   + [onnx.helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None)
                                      for k in tensors], [])
    folder = weights.WeightsFolder(str(tmp_path / "m.onnx"))
    try:
        proto = folder.take(onnx.helper.make_model(graph), tensors, "step")
        assert [v.name for v in proto.graph.input] == ["x"]
        load_external_data_for_model(proto, folder.dir)
    finally:
        folder.close()
    by_name = {t.name: t for t in proto.graph.initializer}
    assert list(by_name) == list(tensors)
    for name, value in tensors.items():
        tensor = by_name[name]
        flat = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert tensor.raw_data == flat and list(tensor.dims) == list(value.shape), name
        assert tensor.data_type == weights.onnx_type(value), name


def test_a_full_disk_on_the_streamed_write_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(weights, "ON_DISK_FROM", 1)

    def full(proto, base, target):
        with open(target, "wb") as f:
            f.write(b"half a mo")
        raise OSError(28, os.strerror(28))
    monkeypatch.setattr(weights, "write_inline", full)
    with pytest.raises(OSError, match=r"cannot write the ONNX model to .*m\.onnx.*No space left on device"):
        onnx_compat.export(_model(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript")
    assert os.listdir(tmp_path) == []


def test_a_quantized_export_gets_the_weights_back_in_memory(monkeypatch, tmp_path):
    """Quantization reads the whole float model: weights kept on disk for memory come back into it."""
    monkeypatch.setattr(weights, "ON_DISK_FROM", 1)
    report = onnx_compat.export(_model(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript",
                                quantize="int8-dynamic")
    assert report.quantization and report.external_data is None
    assert sorted(os.listdir(tmp_path)) == ["m.float.onnx", "m.onnx"], os.listdir(tmp_path)


class Projected(nn.Module):
    """An LSTM with projections: TorchScript writes an ONNX Loop, so ``auto`` times both exporters' graphs
    (``choose.worth_timing``)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 12, proj_size=4, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0] * 2.0


@pytest.mark.skipif(not onnx_compat.versions.HAS_DYNAMO, reason="needs torch's dynamo exporter")
def test_auto_times_both_graphs_with_their_weights_kept_on_disk(monkeypatch, tmp_path):
    """Each graph keeps its own weights' file (its cleanup's too), so both load side by side to be timed."""
    monkeypatch.setattr(weights, "ON_DISK_FROM", 1)
    torch.manual_seed(0)
    b, t, model = Dim("batch"), Dim("time"), Projected().eval()
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("data", [b, t, 6])],
                                [TensorSpec("output", [b, t, 4])], exporter="auto")
    assert [a.exporter for a in report.attempts] == ["torchscript", "dynamo"] and all(a.ok for a in report.attempts)
    assert report.speed["chosen"] == report.exporter and set(report.speed["ratios"]) == {"dynamo", "torchscript"}
    assert os.listdir(tmp_path) == ["m.onnx"] and report.external_data is None
    data = torch.randn(1, 19, 6)
    with torch.no_grad():
        expected = model(data).numpy()
    out = _run(str(tmp_path / "m.onnx"), data)
    assert_not_degenerate(expected, "B=1 T=19")
    assert np.allclose(out, expected, atol=1e-4, rtol=1e-3), np.abs(out - expected).max()
