"""The report says what matters once: hints only where they apply, warnings and findings grouped
(``pipeline/report.py``, ``pipeline/stages.py``, ``graph.py``)."""
import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, ExportError, TensorSpec
from onnx_compat.graph import sentinel_constants
from onnx_compat.pipeline.vanilla import plain_export

B, T = Dim("batch"), Dim("time")
HINT = "a size was frozen into the graph by Python code"


class HarmlessBranch(nn.Module):
    """Python ``if`` on a tensor: a TracerWarning, but the branch is taken at every input."""

    def __init__(self, attention: bool = False):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 8))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True) if attention else None

    def forward(self, x):
        if x.abs().sum() > -1.0:  # always true: "might cause the trace to be incorrect"
            x = self.proj(x).softmax(-1)
        if self.attn is not None:
            x = self.attn(x, x, x, need_weights=False)[0]
        return x


class BakedHalf(nn.Module):
    """``torch.tensor(size)`` is a constant to the tracer: the output's length is frozen."""

    def forward(self, x):
        half = int(torch.tensor(x.shape[1]) // 2)
        return x[:, :half].sum(-1)


def _specs(out_dims):
    return [TensorSpec("data", [B, T, 8])], [TensorSpec("output", out_dims)]


def test_a_tolerance_only_failure_has_no_baked_size_hint(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(ExportError) as failed:
        onnx_compat.export(HarmlessBranch(), str(tmp_path / "m.onnx"), *_specs([B, T, 8]), exporter="torchscript",
                           atol=0.0, rtol=0.0)
    attempt = failed.value.attempts[-1]
    assert "max abs err" in attempt.error and HINT not in str(failed.value), str(failed.value)
    assert attempt.warnings["baked"], "the model was meant to raise a TracerWarning"


def test_a_real_baked_size_names_the_line(tmp_path):
    with pytest.raises(ExportError, match=HINT + r" at .*test_report.py:\d+"):
        onnx_compat.export(BakedHalf(), str(tmp_path / "m.onnx"), *_specs([B, Dim("half")]), exporter="torchscript")
    assert not (tmp_path / "m.onnx").exists()


def test_a_verified_model_has_no_baked_noise_in_its_summary(tmp_path):
    torch.manual_seed(0)
    report = onnx_compat.export(HarmlessBranch(attention=True), str(tmp_path / "m.onnx"), *_specs([B, T, 8]),
                                exporter="torchscript")
    summary = report.summary()
    assert report.warnings["baked"] and report.verified_elsewhere() >= 3
    assert "baked?" not in summary and summary.count("\ntracer ") == 1, summary
    # the three near the example and the far check (B=1, four times the example) a frozen size adds
    assert "disproved, the graph verified at 4 other shape(s)" in summary, summary


class OpenSlices(nn.Module):
    def forward(self, x):
        return sum(x[:, k:].sum(1) for k in range(1, 13))


def test_sentinels_are_one_finding_however_many_slices():
    proto = plain_export(OpenSlices(), (torch.randn(2, 20, 8),), "torchscript", ["data"],
                         {"data": {0: "batch", 1: "time"}})
    slices = sum(n.op_type == "Slice" for n in proto.graph.node)
    found = sentinel_constants(proto)
    assert slices >= 12 and len(found) == 1, found
    assert "Slice x" in found[0] and "more" in found[0] and len(found[0]) < 200, found[0]
