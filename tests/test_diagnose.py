"""diagnose() names the module at fault (issue #14, items 4-5): wrong numbers in one layer, a size baked in
one submodule, an unsupported op three modules down; under both exporters, on small models written here
and on a third-party model with a fault injected by a test-only patch. The model is left as it was."""
import operator

import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.patches import registry
from onnx_compat.diagnosis import diagnose
from onnx_compat.patches.registry import Patch

from helpers import EXPORTERS

D = 8


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(D, D)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Scaled(Leaf):
    """Other numbers only in the exported graph."""

    def forward(self, x):
        y = self.linear(x)
        return y * 1.5 if torch.onnx.is_in_onnx_export() else y


class Baked(nn.Module):
    """A size read as a Python int (``operator.index``; ``int()`` of a size is kept in the graph): a constant."""

    def forward(self, x):
        t = operator.index(x.shape[1])
        return x + torch.arange(t, dtype=x.dtype)[None, :, None] * 0.01


class Unsupported(Leaf):
    def forward(self, x):
        return torch.special.erfcx(self.linear(x))  # no ONNX export under TorchScript


class Block(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.pre, self.inner, self.post = nn.Linear(D, D), inner, nn.Linear(D, D)

    def forward(self, x):
        return self.post(self.inner(self.pre(x)))


class Net(nn.Module):
    """The fault sits in blocks.1.inner; blocks.1.post, blocks.1, blocks.2 and the model inherit it."""

    def __init__(self, fault):
        super().__init__()
        self.blocks = nn.ModuleList([Block(Leaf()), Block(fault()), Block(Leaf())])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _specs():
    return [TensorSpec("data", [Dim("batch"), Dim("time"), D])], [TensorSpec("output", [Dim("batch"), Dim("time"), D])]


def _state(model):
    return ([m.training for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()},
            [len(m._forward_hooks) for m in model.modules()])


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("fault,kind,detail", [
    (Scaled, "numbers", "output differs from eager: max abs err"),
    (Baked, "static dim", "output dim 1 is fixed at 37 in the graph but follows the input in eager"),
])
def test_the_module_where_it_starts_is_named_exactly(fault, kind, detail, exporter):
    torch.manual_seed(0)
    model = Net(fault).eval()
    before = _state(model)
    found = diagnose(model, *_specs(), exporter=exporter)
    first = found.culprit
    assert (first.kind, first.module, first.cls) == (kind, "blocks.1.inner", fault.__name__), found.summary()
    assert detail in first.detail
    assert found.summary().splitlines()[0].startswith(f"culprit blocks.1.inner ({fault.__name__}): ")
    later = [f.module for f in found.findings[1:]]
    assert not any(m.startswith("blocks.0") for m in later)  # nothing before the fault is blamed
    after = _state(model)
    assert after[0] == before[0] and after[2] == before[2]
    assert all(torch.equal(v, after[1][k]) for k, v in before[1].items())


def test_an_unsupported_op_is_named_with_its_line():
    model = Net(Unsupported).eval()
    found = diagnose(model, *_specs(), exporter="torchscript")
    assert (found.culprit.kind, found.culprit.module) == ("export", "blocks.1.inner"), found.summary()
    assert "erfcx" in found.culprit.detail


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_healthy_model_has_no_culprit(exporter):
    found = diagnose(Net(Leaf).eval(), *_specs(), exporter=exporter)
    assert found.findings == [] and found.compared > 10
    assert found.summary().startswith("no fault found")


@pytest.fixture
def scaled_glu():
    pytest.importorskip("conformer")
    """A test-only patch: lucidrains' GLU, while exporting, scales its output (wrong numbers in real code)."""
    def scaled(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) * 1.25

    registry.register(Patch(name="test_scaled_glu", description="test only", when="export",
                            targets=("conformer.conformer:GLU.forward",), wrapper=scaled))
    yield
    registry._REGISTRY.pop("test_scaled_glu")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_fault_injected_into_a_third_party_model_is_found(scaled_glu, exporter):
    """lucidrains' Conformer runs its GLU inside each block's conv module: the first one is named."""
    from onnx_compat.models.zoo import ZOO
    job = ZOO["lucidrains conformer.Conformer"]()
    found = diagnose(job["model"], job["inputs"], job["outputs"], exporter=exporter)
    glus = [n for n, m in job["model"].named_modules() if type(m).__name__ == "GLU"]
    assert found.culprit is not None and found.culprit.module == glus[0], found.summary()
    assert (found.culprit.kind, found.culprit.cls) == ("numbers", "GLU")


def net_job():
    torch.manual_seed(0)
    inputs, outputs = _specs()
    return {"model": Net(Scaled).eval(), "inputs": inputs, "outputs": outputs}


def test_the_cli_prints_the_culprit_first(capsys):
    from onnx_compat.cli import main
    assert main(["diagnose", "test_diagnose:net_job", "--exporter", "torchscript"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("culprit blocks.1.inner (Scaled): output differs from eager")
    assert all(line.startswith("then ") for line in lines[1:]) and len(lines) > 1


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_failed_verification_in_export_names_the_module(exporter, tmp_path):
    """export() diagnoses wrong numbers itself: the culprit is in the ExportError and the attempt."""
    job = net_job()
    with pytest.raises(onnx_compat.ExportError) as failed:
        onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"], exporter=exporter)
    assert str(failed.value).splitlines()[-1].startswith("culprit blocks.1.inner (Scaled): output differs from eager")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="auto needs a second exporter here")
class HalfMean(nn.Module):
    """The mean of the first half of the frames, the half read back from a tensor of the length: TorchScript
    bakes it at the example (``torch.tensor`` of a size is a constant of its trace: wrong numbers at other
    lengths, with the same ops at every length), dynamo keeps it symbolic."""

    def forward(self, x):
        return torch.tanh(x[:, :torch.tensor(x.size(1)).item() // 2].mean(1))


def _stored_steps():
    from pattern_models_round3g import StoredStepsCell
    batch, time = Dim("batch"), Dim("time")
    return StoredStepsCell(), [TensorSpec("states", [batch, time, 2, 8]), TensorSpec("last", [batch, 8]),
                               TensorSpec("gates", [batch, 2, time, 8])], "depends on the example's sizes"


def _half_mean():
    return HalfMean(), [TensorSpec("y", [Dim("batch"), 8])], "VerificationError"


@pytest.mark.parametrize("build", [_stored_steps, _half_mean], ids=["loop_over_time", "baked_slice"])
def test_the_module_search_runs_only_when_no_attempt_verifies(build, tmp_path, monkeypatch):
    """The search for where wrong numbers start exports once per module; auto runs it for the error of an export
    that nothing verified (above), not for a TorchScript attempt that dynamo then makes up for: a loop over time
    TorchScript unrolls at the example (its trace found sized by the example and put off), which dynamo lifts to
    a Scan; a slice TorchScript bakes at the example's half, which dynamo keeps symbolic."""
    from onnx_compat.diagnosis import of_export
    searches = []
    search = of_export.diagnose
    monkeypatch.setattr(of_export, "diagnose", lambda *args, **kwargs: searches.append(1) or search(*args, **kwargs))
    model, outputs, why = build()
    report = onnx_compat.export(model.eval(), str(tmp_path / "m.onnx"), [TensorSpec("x", [Dim("batch"), Dim("time"), 8])],
                                outputs, exporter="auto")
    failed = [a for a in report.attempts if not a.ok]
    assert report.exporter == "dynamo" and [a.exporter for a in failed] == ["torchscript"], report.summary()
    assert why in failed[0].error and not searches, failed[0].error
