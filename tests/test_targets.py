"""Deployment targets (issue #16): the opset and IR version a pinned ONNX Runtime reads, and verification in
runtimes outside this Python (another venv's onnxruntime, Node.js' onnxruntime-node).

The checks in ONNX Runtime 1.16.3 and onnxruntime-node need ``make runtimes``; without them those tests
skip and say so (``make test`` does not build them)."""
import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_compat
from onnx_compat.pipeline import releases as targets
from onnx_compat.models import blstm, conformer
from onnx_compat.runtimes import RuntimeUnavailable
from onnx_compat.runtimes.compare import valid_mask
from onnx_compat.testing import assert_not_degenerate

from helpers import EXPORTERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT116 = os.environ.get("ONNX_COMPAT_ORT116_PYTHON", os.path.join(ROOT, ".venv-ort116", "bin", "python"))
NODE_ORT = os.environ.get("ONNX_COMPAT_ORT_NODE", os.path.join(ROOT, ".node-ort"))
needs_ort116 = pytest.mark.skipif(not os.path.exists(ORT116),
                                  reason=f"no ONNX Runtime 1.16.3 interpreter at {ORT116} (make runtimes)")
needs_node = pytest.mark.skipif(shutil.which("node") is None or not os.path.isdir(os.path.join(NODE_ORT, "node_modules")),
                                reason=f"no node, or no onnxruntime-node under {NODE_ORT} (make runtimes)")


def test_targets_parse_to_the_measured_rows():
    t = targets.parse_target("onnxruntime==1.16")
    assert (t.release, t.opset, t.ir_version) == ("1.16.3", 19, 9)
    assert targets.parse_target(" onnxruntime == 1.16.3 ") == t
    assert targets.parse_target("onnxruntime==1.17").opset == 20


@pytest.mark.parametrize("text,match", [
    ("onnxruntime 1.16", "unknown target 'onnxruntime 1.16'"),
    ("tensorrt==8.6", "unknown target 'tensorrt==8.6'"),
    ("onnxruntime==1.3", "no measured row for onnxruntime 1.3"),
])
def test_a_bad_target_is_one_clear_error_before_anything_is_written(text, match, tmp_path):
    job = conformer.tiny()
    before = {k: v.clone() for k, v in job["model"].state_dict().items()}
    with pytest.raises(targets.TargetError, match=match):
        onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"], target=text)
    assert not os.listdir(tmp_path)
    assert all(torch.equal(v, job["model"].state_dict()[k]) for k, v in before.items())


def test_an_opset_newer_than_the_target_is_refused_up_front(tmp_path):
    job = conformer.tiny()
    with pytest.raises(targets.TargetError, match=r"opset=20 is newer than onnxruntime==1.16.3"):
        onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"], opset=20,
                           target="onnxruntime==1.16")
    assert not os.listdir(tmp_path)


def _tiny(ir, dtype=TensorProto.FLOAT, opset=19):
    x = helper.make_tensor_value_info("x", dtype, [2])
    node = helper.make_node("Identity", ["x"], ["y"])
    node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value="model.py:3")
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", dtype, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def test_fit_lowers_the_ir_version_and_drops_node_metadata():
    model = _tiny(10)
    change = targets.fit(model, targets.parse_target("onnxruntime==1.16"))
    assert change == "IR version 10 -> 9 for onnxruntime==1.16.3 (opset <= 19, IR <= 9)"
    assert model.ir_version == 9 and not model.graph.node[0].metadata_props
    onnx.checker.check_model(model, full_check=True)
    assert targets.fit(model, targets.parse_target("onnxruntime==1.16")) is None  # nothing left to do


def test_fit_refuses_what_the_target_cannot_read():
    old = targets.parse_target("onnxruntime==1.16")
    with pytest.raises(targets.TargetError, match=r"tensor type INT4 needs IR version 10; onnxruntime==1.16.3"):
        targets.fit(_tiny(10, TensorProto.INT4), old)
    with pytest.raises(targets.TargetError, match=r"the model has opset 20; onnxruntime==1.16.3 .* at most opset 19"):
        targets.fit(_tiny(10, opset=20), old)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_116_target_writes_opset_19_and_ir_9(exporter, tmp_path):
    job = conformer.tiny()
    report = onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"],
                                exporter=exporter, target="onnxruntime==1.16")
    written = onnx.load(str(tmp_path / "m.onnx"))
    # 19, or less where this torch's exporter writes no newer opset (2.1's TorchScript: 17)
    assert report.opset["ai.onnx"] == targets.opset_for(exporter, None, targets.parse_target("onnxruntime==1.16"))
    assert report.opset["ai.onnx"] <= 19 and written.ir_version <= 9 and written.ir_version == report.ir_version
    assert report.target == "onnxruntime==1.16.3 (opset <= 19, IR <= 9)"
    assert all(c["ok"] for c in report.verification)


@pytest.mark.parametrize("runtime,match", [
    ("/nonexistent/bin/python", "cannot be started"),
    ("/bin/false", "cannot import onnxruntime and numpy"),
    ("node:/nonexistent", "onnxruntime-node|Node.js"),
])
def test_a_runtime_that_cannot_run_onnxruntime_is_refused_before_export(runtime, match, tmp_path):
    job = blstm.build(hidden=16)
    with pytest.raises(RuntimeUnavailable, match=match):
        onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"], runtimes=[runtime])
    assert not os.listdir(tmp_path)


@needs_ort116
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("factory", [conformer.tiny, lambda: blstm.build(hidden=32)], ids=["conformer", "blstm"])
def test_bundled_models_for_a_116_target_load_and_verify_in_onnxruntime_116(factory, exporter, tmp_path):
    job = factory()
    report = onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"],
                                exporter=exporter, target="onnxruntime==1.16", runtimes=[ORT116])
    there = [c for c in report.verification if c["runtime"]]
    assert len(there) == 3 and all(c["ok"] for c in there), report.summary()
    assert all(c["runtime"].startswith("onnxruntime 1.16.3 (Python") for c in there)


@needs_ort116
def test_without_a_target_the_default_export_does_not_load_in_116(tmp_path):
    """Why targets exist: the default opset 20 export fails in 1.16, and verify() says where."""
    job = conformer.tiny()
    report = onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"],
                                exporter="torchscript")
    if report.opset["ai.onnx"] <= 19:
        pytest.skip(f"torch {torch.__version__}'s TorchScript exporter writes opset {report.opset['ai.onnx']} by "
                    "default, which onnxruntime 1.16 loads")
    with pytest.raises(onnx_compat.VerificationError, match=r"in onnxruntime 1.16.3 .*run failed"):
        onnx_compat.verify(str(tmp_path / "m.onnx"), job["model"], job["inputs"], job["outputs"], runtimes=[ORT116])


@needs_node
def test_the_rasr_style_node_consumer_runs_the_conformer(tmp_path):
    """deploy/node/rasr_consumer.js as docs/deploying.md shows it, on a 1.16-target Conformer; numbers against eager."""
    job = conformer.tiny()
    path = str(tmp_path / "m.onnx")
    report = onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript",
                                target="onnxruntime==1.16", runtimes=[f"node:{NODE_ORT}"])
    assert sum(1 for c in report.verification if c["runtime"] and "Node.js" in c["runtime"] and c["ok"]) == 3
    B, T, F = 3, 41, 20
    g = torch.Generator().manual_seed(7)
    x, lengths = torch.randn(B, T, F, generator=g), torch.tensor([41, 30, 17], dtype=torch.int32)
    x.numpy().astype("<f4").tofile(tmp_path / "x.f32")
    lengths.numpy().astype("<i4").tofile(tmp_path / "x.i32")
    done = subprocess.run(["node", os.path.join(ROOT, "deploy", "node", "rasr_consumer.js"), path,
                           str(tmp_path / "x.f32"), str(B), str(T), str(F), str(tmp_path / "x.i32"),
                           str(tmp_path / "y")], env=dict(os.environ, NODE_PATH=os.path.join(NODE_ORT, "node_modules")),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shapes = json.loads(done.stdout)
    with torch.no_grad():
        expected, expected_len = job["model"](x, lengths)
    got = np.fromfile(tmp_path / "y.f32", dtype="<f4").reshape(shapes["output"])
    assert shapes["lengths"] == expected_len.tolist()
    mask = valid_mask(got.shape, {1: expected_len.numpy()})
    assert np.abs(got - expected.numpy())[mask].max() < 1e-4
    assert_not_degenerate(expected.numpy()[mask], "the native consumer's reference")
