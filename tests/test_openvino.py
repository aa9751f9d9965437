"""OpenVINO as a verification runtime, and the graph fixes that make our exports right in it.

OpenVINO 2026.4 ignores ONNX LSTM ``sequence_lens`` and, with its default
input sharing, returns stale memory for a lengths output made by a Cast to
the same type (when a larger batch ran first). The bundled BLSTM and Conformer, after ``fix_for_openvino``,
verify in OpenVINO at f32 with unequal lengths in one batch (B=1, 4, 2), with
both exporters, and ONNX Runtime's results are unchanged by the fixes.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from torch import nn

from onnx_compat import Dim, TensorSpec, VerificationError, export, verify
from onnx_compat.models import blstm, conformer
from onnx_compat.openvino_fixes import fix_for_openvino
from helpers import EXPORTERS

ov = pytest.importorskip("openvino")
from onnx_compat.runtimes_openvino import openvino_runtime  # noqa: E402

MEASURED = "2026.4.1"  # the release the two failures were measured on
BUGGY = ov.get_version().split("-")[0] == MEASURED


def _export(job, tmp_path, exporter):
    path = os.path.join(tmp_path, f"{exporter}.onnx")
    export(job["model"], path, job["inputs"], job["outputs"], exporter=exporter)
    return path


def _fixed(path):
    proto = onnx.load(path)
    changes, kept = fix_for_openvino(proto)
    fixed = path.replace(".onnx", "_ov.onnx")
    onnx.save(proto, fixed)
    return fixed, changes, kept


def _verify(path, job, runtime):
    return verify(path, job["model"], job["inputs"], job["outputs"], runtimes=[runtime])



@pytest.mark.parametrize("exporter", EXPORTERS)
def test_packed_blstm_verifies_in_openvino_after_the_fix(exporter, tmp_path):
    job = blstm.build(features=20, classes=10, hidden=16)
    path = _export(job, tmp_path, exporter)
    runtime = openvino_runtime()
    if BUGGY:
        with pytest.raises(VerificationError, match=r"in OpenVINO .* \(CPU, f32\)"):
            _verify(path, job, runtime)
    fixed, changes, kept = _fixed(path)
    assert sum("sequence_lens -> per-direction" in c for c in changes) == 2 and not kept, (changes, kept)
    feeds = {"data": np.random.default_rng(0).standard_normal((3, 41, 20)).astype(np.float32),
             "data:size1": np.array([41, 23, 30], np.int32)}
    before, after = (ort.InferenceSession(p).run(None, feeds) for p in (path, fixed))
    assert all(np.array_equal(a, b) for a, b in zip(before, after)), "the rewrite changed ONNX Runtime's outputs"
    results = _verify(fixed, job, openvino_runtime())  # ONNX Runtime, then OpenVINO: B=1, 4, 2, lengths unequal
    in_openvino = [r for r in results if r.runtime and "OpenVINO" in r.runtime]
    assert [r.sizes["batch"] for r in in_openvino] == [1, 4, 2] and all(r.ok for r in results), results
    assert max(o.max_abs_err for r in in_openvino for o in r.outputs) < 1e-4


class ConvWithLengths(nn.Module):
    """Lengths returned as they came in: TorchScript writes ``output:size1 = Cast(data:size1)`` to int32."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 6, 3, padding=1)

    def forward(self, data, lengths):
        return self.conv(data.transpose(1, 2)).transpose(1, 2), lengths


def _stale_lengths(path, features):
    """Every ordered pair of four batches, each on a freshly compiled model: the pairs whose lengths came back wrong."""
    shapes = {1: (23, [23]), 4: (97, [97, 60, 80, 97]), 2: (30, [30, 8]), 3: (50, [50, 20, 50])}
    wrong = []
    for order in itertools.permutations(shapes, 2):
        runtime = openvino_runtime()
        for batch in order:
            time, lengths = shapes[batch]
            feeds = {"data": np.random.default_rng(batch).standard_normal((batch, time, features)).astype(np.float32),
                     "data:size1": np.array(lengths, np.int32)}
            got = runtime.run(path, feeds)["output:size1"].tolist()
            if got != lengths:
                wrong.append((order, batch, got))
                break
    return wrong


def test_same_type_cast_of_lengths_is_right_in_openvino_after_the_fix(tmp_path):
    """After a larger batch, a smaller one read stale memory (garbage lengths) before the fix."""
    batch, time = Dim("batch"), Dim("time")
    job = {"model": ConvWithLengths().eval(), "inputs": [TensorSpec("data", [batch, time, 8], lengths=[1])],
           "outputs": [TensorSpec("output", [batch, time, 6], lengths=[1])]}
    path = _export(job, tmp_path, "torchscript")
    assert any(n.op_type == "Cast" and n.output[0] == "output:size1" for n in onnx.load(path).graph.node)
    if BUGGY:
        wrong = _stale_lengths(path, 8)
        # only after a larger batch: B=1 first (verify's order) hides it
        assert wrong and all(max(order[:order.index(b)], default=0) > b for order, b, _ in wrong), wrong
    fixed, changes, _ = _fixed(path)
    assert changes == ["output 'output:size1': Cast to its own type (INT32) -> Identity"], changes
    assert _stale_lengths(fixed, 8) == []
    assert all(r.ok for r in _verify(fixed, job, openvino_runtime()))


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_bundled_conformer_verifies_in_openvino(exporter, tmp_path):
    job = conformer.tiny()
    fixed, _, kept = _fixed(_export(job, tmp_path, exporter))
    runtime = openvino_runtime()
    results = _verify(fixed, job, runtime)
    assert not kept and all(r.ok for r in results), results
    assert {r.sizes["batch"] for r in results if r.runtime} == {1, 4, 2}
    assert runtime.latency()["calls"] == 3 and runtime.latency()["median_s"] > 0


def test_openvino_is_forced_to_f32_and_a_missing_device_is_one_error():
    runtime = openvino_runtime()
    assert runtime.precision == "f32" and runtime.name.endswith("(CPU, f32)")
    from onnx_compat import RuntimeUnavailable
    with pytest.raises(RuntimeUnavailable, match="OpenVINO has no device 'NPU9'"):
        openvino_runtime("NPU9")
