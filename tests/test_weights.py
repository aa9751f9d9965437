"""Models whose weights go to a data file (past protobuf's 2 GB; here a tiny model with the limit lowered,
the real > 2 GB run is benchmarks/model_size.py): written, loaded from the path, verified, and nothing
left behind or broken when a step fails."""
import errno
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, ExportError, TensorSpec

from onnx_compat.pipeline import files
from onnx_compat.pipeline import weights

from helpers import EXPORTERS


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(16, 64, 4, padding="same", dilation=2)  # the conv patch acts as well
        self.proj = nn.Linear(64, 8)

    def forward(self, data):
        return self.proj(torch.relu(self.conv(data.transpose(1, 2))).transpose(1, 2))


SPECS = ([TensorSpec("data", [Dim("batch"), Dim("time"), 16])], [TensorSpec("out", [Dim("batch"), Dim("time"), 8])])


@pytest.fixture
def spill(monkeypatch):
    monkeypatch.setattr(weights, "IN_MEMORY_LIMIT", 1)  # every model takes the > 2 GB path


def _model():
    torch.manual_seed(0)
    return Wide().eval()


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_weights_are_written_beside_the_model_and_load_from_its_path(spill, exporter, tmp_path):
    model = _model()
    path = str(tmp_path / "big.onnx")
    report = onnx_compat.export(model, path, *SPECS, exporter=exporter)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]  # no temporary folder left
    assert report.external_data == "big.onnx.data" and "weights in big.onnx.data beside it" in report.summary()
    graph = onnx.load(path, load_external_data=False)
    places = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert places == {"big.onnx.data"}
    assert os.path.getsize(path) < 10_000 < os.path.getsize(path + ".data")  # the weights are in the data file
    assert report.verification and all(c["ok"] for c in report.verification)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch, time in [(1, 13), (3, 29)]:  # not the export example's shape
        x = torch.randn(batch, time, 16)
        with torch.no_grad():
            expected = _model()(x).numpy()  # the unpatched eager model
        got = sess.run(None, {"data": x.numpy()})[0]
        assert got.shape == expected.shape and np.abs(expected).max() > 0.1
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_cleanup_works_on_a_model_with_a_data_file(spill, tmp_path):
    report = onnx_compat.export(_model(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript")
    assert report.nodes <= report.nodes_before_cleanup
    assert report.ops.get("Pad", 0) == 0  # the asymmetric "same" Pad folded into the Conv


def _previous_model(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous model")
    (tmp_path / "m.onnx.data").write_bytes(b"previous data")
    return str(path)


def _unchanged(tmp_path):
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx").read_bytes() == b"previous model"
    assert (tmp_path / "m.onnx.data").read_bytes() == b"previous data"


class WrongWhenExported(Wide):
    """Another number only inside the ONNX export: the graph is wrong, the eager model is right."""

    def forward(self, data):
        out = super().forward(data)
        return out + 1.0 if torch.onnx.is_in_onnx_export() else out


def test_a_failed_verification_leaves_the_previous_model_and_data_intact(spill, tmp_path):
    path = _previous_model(tmp_path)
    torch.manual_seed(0)
    model = WrongWhenExported().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ExportError, match="max abs err"):
        onnx_compat.export(model, path, *SPECS, exporter="torchscript")
    _unchanged(tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not model.training


@pytest.mark.parametrize("large", [False, True], ids=["in-memory", "data-file"])
def test_a_full_disk_is_one_clear_error_and_nothing_changes(monkeypatch, tmp_path, large):
    if large:
        monkeypatch.setattr(weights, "IN_MEMORY_LIMIT", 1)
    path = _previous_model(tmp_path)

    real = onnx.save

    def full(proto, target, *args, **kwargs):
        if not os.path.basename(str(target)).endswith(".tmp"):  # only the final write beside the target fails
            return real(proto, target, *args, **kwargs)
        with open(target, "wb") as f:
            f.write(b"half a mo")  # a partial file, as a full disk leaves it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.onnx, "save", full)
    with pytest.raises(OSError, match=r"cannot write the ONNX model to .*m\.onnx.*No space left on device"):
        onnx_compat.export(_model(), path, *SPECS, exporter="torchscript")
    _unchanged(tmp_path)


def test_a_folder_without_room_for_the_weights_is_refused_before_exporting(monkeypatch, tmp_path):
    path = _previous_model(tmp_path)
    stats = os.statvfs(tmp_path)
    tiny = os.statvfs_result((stats.f_bsize, stats.f_frsize, stats.f_blocks, 1, 1) + tuple(stats)[5:])
    monkeypatch.setattr(files.os, "statvfs", lambda folder: tiny)
    stages = []
    with pytest.raises(ValueError, match=r"weights need 0\.\d MiB and folder .* has 0\.0 MiB free"):
        onnx_compat.export(_model(), path, *SPECS, exporter="torchscript", progress=stages.append)
    assert not any(stage.startswith("capture") for stage in stages), stages
    _unchanged(tmp_path)


def test_external_data_on_request_and_refused_where_it_must_be(monkeypatch, tmp_path):
    stages = []
    report = onnx_compat.export(_model(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript", external_data=True,
                                progress=stages.append)
    assert report.external_data == "m.onnx.data" and sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert "capture (torchscript)" in stages, stages  # what the refusal before exporting is told apart by
    monkeypatch.setattr(weights, "PROTOBUF_LIMIT", 1)  # as if the weights were past 2 GB
    with pytest.raises(ValueError, match=r"external_data=False: the weights \(0\.00 GiB\) do not fit in one protobuf"):
        onnx_compat.export(_model(), str(tmp_path / "n.onnx"), *SPECS, exporter="torchscript", external_data=False)
    assert not (tmp_path / "n.onnx").exists()
