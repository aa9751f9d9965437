"""What the report says of each stage's time and of the file it wrote (issue #50).

The cleanup runs in a second thread while the eager model computes the verification references: its timing is
the optimiser's own, the references have theirs, so a slow eager model is not read as a slow cleanup. The
file's hash is taken while the one-file model is streamed out, and must be the hash of the file on disk.
"""
from __future__ import annotations

import time

import torch
from torch import nn

import onnx_compat
from onnx_compat.pipeline import stages, weights
from onnx_compat.pipeline.files import content_hash
from onnx_compat.spec import Dim, TensorSpec

SPECS = ([TensorSpec("data", [Dim("batch"), Dim("time"), 8])], [TensorSpec("output", [Dim("batch"), Dim("time"), 4])])


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, data):
        return self.out(torch.relu(self.proj(data)).flip(1))


def test_cleanup_is_timed_apart_from_the_references_computed_beside_it(monkeypatch, tmp_path):
    slow = 0.4
    real = stages.reference_cases

    def slow_references(*args, **kwargs):
        time.sleep(slow)
        return real(*args, **kwargs)
    monkeypatch.setattr(stages, "reference_cases", slow_references)
    torch.manual_seed(0)
    report = onnx_compat.export(Small(), str(tmp_path / "m.onnx"), *SPECS, exporter="torchscript")
    t = report.timings
    assert {"export_torchscript", "repair", "references", "cleanup", "verify", "write", "total"} <= set(t), t
    assert t["references"] >= slow and t["cleanup"] < slow, t


def test_the_hash_taken_while_streaming_the_one_file_model_is_the_files(monkeypatch, tmp_path):
    monkeypatch.setattr(weights, "ON_DISK_FROM", 1)  # weights kept in a file, streamed into the one .onnx
    torch.manual_seed(0)
    path = str(tmp_path / "m.onnx")
    report = onnx_compat.export(Small(), path, *SPECS, exporter="torchscript")
    assert report.external_data is None and report.model_sha256 == content_hash(path)
    beside = str(tmp_path / "b.onnx")
    report = onnx_compat.export(Small(), beside, *SPECS, exporter="torchscript", external_data=True)
    assert report.external_data == "b.onnx.data" and report.model_sha256 == content_hash(beside)


def test_openvino_fixes_infer_types_without_serialising_the_weights(monkeypatch):
    """The element types come from the graph with its weights declared as inputs (the same types as inference
    on the whole model), so a model held in memory is not serialised for them (98 MiB Conformer: 0.33 s)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx_compat.pipeline import openvino_fixes
    weight = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 256], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"]),
             helper.make_node("Cast", ["z"], ["out"], to=TensorProto.INT32)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 256])],
                              [helper.make_tensor_value_info("out", TensorProto.INT32, None)], [weight, shape])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    full = onnx.shape_inference.infer_shapes(proto)
    given = []
    real = onnx.shape_inference.infer_shapes

    def spy(model, *args, **kwargs):
        given.append(len(model.graph.initializer))
        return real(model, *args, **kwargs)
    monkeypatch.setattr(openvino_fixes.onnx.shape_inference, "infer_shapes", spy)
    types = openvino_fixes._elem_types(proto)
    assert given == [0]
    expected = {**openvino_fixes._declared_types(proto), **openvino_fixes._declared_types(full)}
    assert types == expected and types["y"] == TensorProto.FLOAT and types["z"] == TensorProto.FLOAT, types
