"""Cleanup keeps numbers and dims, folds the pad subgraph, and refuses to change a model."""

import operator

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_compat
from onnx_compat import ExportError, TensorSpec

from onnx_compat.pipeline.cleanup import cleanup
from onnx_compat.models import conv_demo

from helpers import PAD_FUSION, export, needs_dynamo

from onnx_compat.pipeline import stages as export_mod  # the stages of export()
from onnx_compat.testing import assert_not_degenerate


@pytest.fixture(scope="module")
def hard():
    return conv_demo.build_hard()


def test_pad_subgraph_is_fused_and_numbers_kept(hard, tmp_path):
    report = onnx_compat.export(hard["model"], str(tmp_path / "t.onnx"), hard["inputs"], hard["outputs"],
                                exporter="torchscript")
    assert report.nodes_before_cleanup > report.nodes
    assert ("Pad" not in report.ops or not PAD_FUSION) and report.ops["Conv"] == 3
    assert all(c["ok"] for c in report.verification)         # verified after cleanup
    assert report.inputs[0]["dims"] == ["batch", "time", 40]
    meta = {p.key for p in onnx.load(str(tmp_path / "t.onnx")).metadata_props}
    assert "onnx_compat.exporter" in meta                     # cleanup keeps metadata


@needs_dynamo
def test_cleaned_torchscript_has_the_dynamo_node_count(hard, tmp_path):
    ts = onnx_compat.export(hard["model"], str(tmp_path / "t.onnx"), hard["inputs"], hard["outputs"],
                            exporter="torchscript")
    dy = onnx_compat.export(hard["model"], str(tmp_path / "d.onnx"), hard["inputs"], hard["outputs"],
                            exporter="dynamo", cleanup=True)
    assert ts.nodes == dy.nodes and all(c["ok"] for c in dy.verification)


def _break_numbers(proto, *_):
    """As ``stages.clean_graph``: the cleaned graph and a session (none: the verification opens its own)."""
    out = cleanup(proto)
    for init in out.graph.initializer:
        if init.name.endswith("bias"):
            arr = onnx.numpy_helper.to_array(init) + 1.0
            init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
            break
    return out, None


def _lose_dim(proto, *_):
    out = cleanup(proto)
    dim = out.graph.input[0].type.tensor_type.shape.dim[1]
    dim.dim_value = 37
    return out, None


@pytest.mark.parametrize("bad, match", [(_break_numbers, "cleanup changed the model's outputs"),
                                        (_lose_dim, "cleanup lost a dynamic dim")])
def test_a_cleanup_that_changes_the_model_is_an_error(bad, match, hard, tmp_path, monkeypatch):
    monkeypatch.setattr(export_mod, "clean_graph", bad)
    with pytest.raises(ExportError, match=match):
        onnx_compat.export(hard["model"], str(tmp_path / "x.onnx"), hard["inputs"], hard["outputs"],
                           exporter="torchscript")
    assert not (tmp_path / "x.onnx").exists()


class _BakedBatch(torch.nn.Module):
    def forward(self, x):  # [B, 4, T]; the trace freezes B into the Reshape (int() of it is kept, index() not)
        return x.reshape(operator.index(x.shape[0]), -1) * 2


def test_a_dim_the_export_froze_is_not_blamed_on_the_cleanup(tmp_path):
    """The cleanup's folding only shows a dim the TorchScript trace froze; the graph as exported fails at the
    other sizes as well, and the error says so (a cleanup that loses a dim is the test above)."""
    with pytest.raises(ExportError) as info:
        onnx_compat.export(_BakedBatch(), str(tmp_path / "b.onnx"), [TensorSpec("x", ["batch", 4, "time"])],
                           [TensorSpec("y", ["batch", None])], exporter="torchscript")
    message = str(info.value)
    assert "the export froze a dynamic dim (cleanup's folding shows it): 'y' dim 0 ('batch')" in message
    assert "fails at other sizes too: at sizes {'batch': 1" in message and "cleanup lost" not in message
    assert not (tmp_path / "b.onnx").exists()


def test_the_cleaned_graph_holds_its_weights():
    """ONNX Runtime writes the cleaned weights to a file of its own: the graph returned holds them again
    (no reference to that file, gone with its folder), runs from its bytes alone and writes the file a
    graph cleaned in memory always wrote."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    cleaned = cleanup(export(model, (torch.randn(3, 64),), "torchscript", {0: {0: "batch"}}))
    big = [t for t in cleaned.graph.initializer if len(t.raw_data) >= 1024]
    assert big, "no weight big enough for ONNX Runtime to write it apart"
    assert not [t.name for t in cleaned.graph.initializer
                if t.external_data or t.HasField("data_location") or t.HasField("doc_string")]
    sess = ort.InferenceSession(cleaned.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = torch.randn(batch, 64)
        with torch.no_grad():
            expected = model(x).numpy()
        assert_not_degenerate(expected, f"at batch {batch}")
        np.testing.assert_allclose(sess.run(None, {"x0": x.numpy()})[0], expected, atol=1e-5, rtol=1e-4,
                                   err_msg=f"at batch {batch}")
