"""The int32/int64 repair (a RETURNN-like model that does not load without it) and inspect's findings."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from onnx_compat import Dim, TensorSpec, describe as inspect

from onnx_compat import export
from onnx_compat.cli import main as cli
from onnx_compat.int_repair import repair_int_types
from onnx_compat.testing import assert_not_degenerate

from helpers import export as plain_export


class ReturnnLike(nn.Module):
    """int32 lengths flow into shape arithmetic, as in RETURNN's Conformer: the padded length
    is ``lengths.max()`` and the frames are regrouped with a reshape to it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 8)

    def forward(self, data, lengths):
        T = lengths.max()
        y = self.lin(data)[:, :T]
        return y.reshape(data.shape[0], T, 2, 4).sum(-1) * (torch.arange(T)[None, :] < lengths[:, None])[..., None]


def _inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g, dtype=torch.int32)
    lengths[0] = T
    return torch.randn(B, T, 6, generator=g), lengths


def _vanilla():
    model = ReturnnLike().eval()
    proto = plain_export(model, _inputs(2, 37, 0), "torchscript", {0: {0: "batch", 1: "time"}, 1: {0: "batch"}})
    return model, proto


def test_the_model_does_not_load_without_the_repair():
    _, proto = _vanilla()
    with pytest.raises(Exception, match="bound to different types"):
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def test_repair_makes_it_load_and_match_eager():
    model, proto = _vanilla()
    fixed, done = repair_int_types(proto)
    assert any(d.startswith("Concat") for d in done) and all("int32 -> int64" in d for d in done)
    sess = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, (B, T) in enumerate([(1, 23), (3, 50)], start=1):
        x, lengths = _inputs(B, T, seed)
        got = sess.run(None, {"x0": x.numpy(), "x1": lengths.numpy()})[0]
        expected = model(x, lengths).detach().numpy()
        assert_not_degenerate(expected, f"at B={B}, T={T}")
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)
    assert repair_int_types(fixed)[1] == []  # nothing left to do


def test_pipeline_repairs_and_reports(tmp_path):
    batch, time = Dim("batch"), Dim("time")
    report = export(ReturnnLike().eval(), str(tmp_path / "m.onnx"),
                    [TensorSpec("data", [batch, time, 6], lengths=[1])], [TensorSpec("output", [batch, time, 2])],
                    exporter="torchscript")
    assert report.repairs and "repaired" in report.summary()


def test_cli_repair(tmp_path, capsys):
    _, proto = _vanilla()
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    assert cli(["repair", str(src), "--out", str(dst)]) == 0
    assert "int32 -> int64" in capsys.readouterr().out
    ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])


def _crafted():
    """Conv with auto_pad, a Slice ending at INT64_MAX, and an input whose time dim is static."""
    x = helper.make_tensor_value_info("data", TensorProto.FLOAT, ["batch", 4, 37])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4, None])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3], np.ones(48, np.float32))
    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [1])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [2 ** 63 - 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    nodes = [helper.make_node("Conv", ["data", "w"], ["c"], name="conv0", auto_pad="SAME_UPPER"),
             helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["output"], name="open_slice")]
    graph = helper.make_graph(nodes, "g", [x], [y], [w, starts, ends, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inspect_findings_on_a_crafted_model():
    found = inspect(_crafted(), dynamic={"data": {0: "batch", 2: "time"}})["findings"]
    assert any("conv0" in f and "auto_pad" in f for f in found)
    assert any("9223372036854775807" in f and "'ends'" in f and "Slice ('open_slice')" in f for f in found)
    assert any("'data' dim 2" in f and "37" in f for f in found)
    assert len(found) == 3


def test_inspect_reads_intent_from_metadata_and_the_cli_flag(tmp_path, capsys):
    proto = _crafted()
    helper.set_model_props(proto, {"onnx_compat.inputs": '[{"name": "data", "dims": ["batch", 4, "time"]}]'})
    assert any("'data' dim 2 ('time')" in f for f in inspect(proto)["findings"])
    path = tmp_path / "m.onnx"
    onnx.save(_crafted(), path)
    assert cli(["inspect", str(path), "--dynamic", "data:2"]) == 0
    assert "finding  'data' dim 2" in capsys.readouterr().out
    assert cli(["inspect", str(path), "--dynamic", "data"]) == 2


def test_clean_exports_have_no_findings(tmp_path):
    from onnx_compat.models import conv_demo
    job = conv_demo.build()
    report = export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"], exporter="torchscript")
    assert report.findings == [] and report.repairs == []
