"""A failed export names the module at fault: a fault injected at a known depth is found exactly,
under both exporters, through the pipeline, the report and the CLI."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import onnx_compat
from onnx_compat import Dim, ExportError, TensorSpec
from onnx_compat import versions

from onnx_compat.patches import registry
from onnx_compat.patches.registry import Patch

from helpers import EXPORTERS


class Leaf(nn.Module):
    def __init__(self, fault=None):
        super().__init__()
        self.fault, self.lin = fault, nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.fault == "op":
            return torch.special.erfcx(y)  # FAULT op: no ONNX export under TorchScript
        if self.fault == "guard":
            if y.sum() > 0:  # FAULT guard: data-dependent control flow
                return 2 * y
        if self.fault == "pool":
            return F.adaptive_max_pool1d(y.transpose(1, 2), 3).transpose(1, 2)  # FAULT pool
        return y


class Block(nn.Module):
    def __init__(self, fault):
        super().__init__()
        self.inner = nn.ModuleList([Leaf(), Leaf(fault)])

    def forward(self, x):
        for layer in self.inner:
            x = layer(x)
        return x


class Faulty(nn.Module):
    """The fault sits three modules down: encoder.1.inner.1 (Leaf)."""

    def __init__(self, fault):
        super().__init__()
        self.encoder = nn.Sequential(Leaf(), Block(fault))

    def forward(self, x):
        return self.encoder(x)


def _job(fault):
    batch = Dim("batch")
    out_time = 3 if fault == "pool" else Dim("time")
    return (Faulty(fault).eval(), [TensorSpec("x", [batch, Dim("time"), 4])],
            [TensorSpec("y", [batch, out_time, 4])])


def _line(marker):
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, start=1) if f"# FAULT {marker}" in line)


CASES = [("op", "torchscript", None), ("guard", "dynamo", None), ("pool", "dynamo", {"only": []}),
         ("pool", "torchscript", {"only": []})]


@pytest.mark.parametrize("fault,exporter,patches", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_module_at_fault_is_named_exactly(fault, exporter, patches, tmp_path):
    if exporter not in EXPORTERS:
        pytest.skip(versions.NO_DYNAMO)
    model, inputs, outputs = _job(fault)
    training = [m.training for m in model.modules()]
    with pytest.raises(ExportError) as failed:
        onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, exporter=exporter, patches=patches)
    culprit = str(failed.value).splitlines()[-1]
    assert culprit.startswith("culprit encoder.1.inner.1 (Leaf): "), culprit
    if fault != "pool" or exporter == "torchscript":  # the translator's node trace ends in torch's own code
        assert f"test_culprit.py:{_line(fault)}]" in culprit, culprit
    assert [m.training for m in model.modules()] == training and not (tmp_path / "m.onnx").exists()


def test_each_failed_attempt_has_its_culprit_in_the_report(tmp_path):
    """auto: TorchScript fails on the op, dynamo exports it; the report keeps the failed attempt's culprit."""
    if "dynamo" not in EXPORTERS:
        pytest.skip(versions.NO_DYNAMO)
    model, inputs, outputs = _job("op")
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, exporter="auto", verify=False)
    failed = [a for a in report.attempts if not a.ok]
    assert [a.exporter for a in failed] == ["torchscript"] and report.exporter == "dynamo"
    assert failed[0].culprit.startswith("culprit encoder.1.inner.1 (Leaf): UnsupportedOperatorError"), failed[0].culprit
    assert f"test_culprit.py:{Leaf.forward.__code__.co_firstlineno + 3}" in failed[0].culprit, failed[0].culprit
    assert failed[0].culprit in report.summary()


def faulty_job():
    model, inputs, outputs = _job("op")
    return {"model": model, "inputs": inputs, "outputs": outputs}


def test_the_cli_prints_the_culprit_line(tmp_path, capsys):
    from onnx_compat.cli import main
    assert main(["export", "test_culprit:faulty_job", "--out", str(tmp_path / "m.onnx"), "--exporter",
                 "torchscript"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("onnx-compat: ExportError: torchscript export failed: UnsupportedOperatorError")
    assert lines[1].startswith("culprit encoder.1.inner.1 (Leaf): UnsupportedOperatorError") and len(lines) == 2


@pytest.fixture
def injected_fault():
    """A test-only patch: F.glu, while exporting, computes through an op TorchScript cannot write."""
    def faulty_glu(wrapped, instance, args, kwargs):
        return torch.special.erfcx(wrapped(*args, **kwargs))  # FAULT injected

    registry.register(Patch(name="test_fault_glu", description="test only", when="export",
                            targets=("torch.nn.functional:glu",), wrapper=faulty_glu))
    yield
    registry._REGISTRY.pop("test_fault_glu")


def test_a_fault_in_a_real_model_is_found(injected_fault, tmp_path):
    """The bundled Conformer calls F.glu in each block's conv module: the first is named. The fault is a
    patch's, so the export itself succeeds without the patches (``tests/test_capture.py``); the failed
    patched attempt keeps its culprit on the report."""
    from onnx_compat.models import conformer
    job = conformer.tiny()
    report = onnx_compat.export(job["model"], str(tmp_path / "c.onnx"), job["inputs"], job["outputs"],
                                exporter="torchscript")
    assert [(a.label, a.ok) for a in report.attempts] == [("torchscript", False),
                                                          ("torchscript without the patches", True)]
    culprit = report.attempts[0].culprit
    assert culprit.startswith("culprit blocks.0.conv (ConvModule): UnsupportedOperatorError"), culprit
    assert culprit.endswith(f"test_culprit.py:{_line('injected')}]")  # the line that made the op
