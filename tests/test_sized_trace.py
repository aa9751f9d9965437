"""auto's TorchScript attempt on a trace that depends on the example's sizes (``pipeline/sized_trace.py``): found
by a second trace before the unrolled graph is converted, put off until dynamo has had its turn, and run in full
when dynamo does not verify."""
import inspect

import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.models.loop_cases import SteppedCell, TimeFirstCell
from onnx_compat.pipeline import capture

from helpers import HAS_DYNAMO

pytestmark = pytest.mark.skipif(not HAS_DYNAMO, reason="auto puts TorchScript off only where dynamo can go first")


class CopiedPerFrame(torch.nn.Module):
    """A copy per frame: the trace grows with the length, but every unrolled graph computes ``2 x`` + 1."""

    def forward(self, x):
        y = x * 2
        for _ in range(x.size(1)):
            y = y.clone()
        return y + 1


def _specs(features):
    b, t = Dim("batch"), Dim("time")
    return [TensorSpec("x", [b, t, features])], [TensorSpec("y", [b, t, None])]


@pytest.fixture
def conversions(monkeypatch):
    """How many TorchScript graphs were converted to ONNX."""
    count = []
    original = torch._C._jit_pass_onnx

    def counted(*args, **kwargs):
        count.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(torch._C, "_jit_pass_onnx", counted)
    return count


def _loop_line(cls) -> str:
    source, start = inspect.getsourcelines(cls.forward)
    return f"{inspect.getsourcefile(cls)}:{start + next(i for i, line in enumerate(source) if 'for ' in line)}"


def test_a_trace_sized_by_the_example_goes_to_dynamo_unconverted(tmp_path, conversions):
    inputs, outputs = _specs(4)
    report = onnx_compat.export(SteppedCell().eval(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="auto")
    assert report.exporter == "dynamo" and "put off, not converted" in report.why, report.summary()
    first = report.attempts[0]
    assert first.exporter == "torchscript" and not first.ok
    assert "depends on the example's sizes" in first.error and _loop_line(SteppedCell) in first.error, first.error
    assert conversions == [], "the unrolled trace was converted to ONNX all the same"
    assert {c["sizes"]["time"] for c in report.verification} >= {23, 53}, report.verification


def test_a_time_first_loop_is_put_off_too(tmp_path, conversions):
    """``for x_t in x`` over ``[T, B, F]`` loops over axis 0: the second trace varies that axis as well."""
    t, b = Dim("time"), Dim("batch")
    inputs, outputs = [TensorSpec("x", [t, b, 4])], [TensorSpec("y", [t, b, 6])]
    report = onnx_compat.export(TimeFirstCell().eval(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="auto")
    assert report.exporter == "dynamo" and "put off, not converted" in report.why, report.summary()
    assert _loop_line(TimeFirstCell) in report.attempts[0].error, report.attempts[0].error
    assert conversions == [], "the unrolled trace was converted to ONNX all the same"
    assert len({c["sizes"]["time"] for c in report.verification}) == 3, report.verification


def test_torchscript_comes_back_in_full_when_dynamo_does_not_verify(tmp_path, conversions, monkeypatch):
    def no_dynamo(self, request, captured):
        raise RuntimeError("dynamo made to fail here")
    monkeypatch.setattr(capture.Dynamo, "capture", no_dynamo)
    inputs, outputs = _specs(3)
    model = CopiedPerFrame().eval()
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, exporter="auto")
    assert report.exporter == "torchscript" and report.attempts[0].ok, report.summary()
    assert [a.exporter for a in report.attempts][:2] == ["torchscript", "dynamo"], report.attempts
    assert len(conversions) == 1  # the put-off attempt converted nothing; the one in full, its graph
    x = torch.randn(2, 11, 3)
    assert torch.equal(model(x), x * 2 + 1)  # what verification checked at other lengths is not all zeros


def test_an_explicit_torchscript_export_is_not_put_off(tmp_path, conversions):
    inputs, outputs = _specs(4)
    with pytest.raises(onnx_compat.ExportError, match="pattern|unrolled|frozen"):
        onnx_compat.export(SteppedCell().eval(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript")
    assert conversions, "exporter='torchscript' converted no graph: it was put off with nothing to go first"
