"""``torch.autograd.grad`` inside forward (torch-struct's marginals, a force field's forces): the dynamo
exporter captures such a model below autograd, where the backward pass is recorded as ops, and the graph is
checked against the unpatched eager model at new sizes, B = 1 included. TorchScript records no backward pass:
refused at the call's line, saying which exporter takes it."""
import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3e import EnergyForces, GradientMarginals


def _potentials(B, T, seed):
    return (torch.randn(B, T, 4, 4, generator=torch.Generator().manual_seed(seed)),)


def _positions(B, T, seed):
    return (torch.randn(B, T, 3, generator=torch.Generator().manual_seed(seed)),)


_UNPATCHED = "fake tensor in the exported program constant"  # torch.export's pre-dispatch trace, no model line
CASES = [
    PatchCase("gradient_marginals", GradientMarginals, _potentials, {0: {0: "batch", 1: "time"}},
              sizes=((1, 23), (3, 50), (2, 1)), vanilla={"dynamo": _UNPATCHED}, exporters=("dynamo",),
              atol=1e-5, rtol=1e-4),
    PatchCase("energy_forces", EnergyForces, _positions, {0: {0: "batch", 1: "time"}},
              sizes=((1, 23), (3, 50), (2, 148)), vanilla={"dynamo": _UNPATCHED}, exporters=("dynamo",),
              atol=1e-4, rtol=1e-3),
]
test_gradient_exports, test_gradient_vanilla_fails_as_recorded = patch_case_tests(CASES)


def test_eager_is_untouched_inside_patched():
    for case in CASES:
        case.assert_eager_untouched()


def test_outputs_are_gradients_not_zeros():
    """The checked outputs move with the input: a graph of zeros (a gradient cut off) would not pass."""
    for case in CASES:
        out = case.model()(*case.inputs(2, 9, 3))
        assert out.abs().max() > 1e-2 and out.std() > 1e-3, case.name


def test_torchscript_names_the_call_and_the_exporter_that_takes_it(tmp_path):
    """TorchScript's trace holds no backward pass: the refusal names the model's line and dynamo; ``auto``
    goes on to dynamo and writes a verified graph."""
    b, t = Dim("batch"), Dim("time")
    io = dict(inputs=[TensorSpec("x", [b, t, 3])], outputs=[TensorSpec("f", [b, t, 3])])
    with pytest.raises(onnx_compat.errors.ExportError) as raised:
        onnx_compat.export(EnergyForces(), str(tmp_path / "ts.onnx"), exporter="torchscript", **io)
    line = EnergyForces.forward.__code__.co_firstlineno + 5
    head = str(raised.value).split("also tried")[0]
    assert f"pattern_models_round3e.py:{line}: torch.autograd.grad inside the model's forward" in head, head
    assert "the dynamo exporter captures it below autograd" in head, head
    assert not (tmp_path / "ts.onnx").exists()
    report = onnx_compat.export(EnergyForces(), str(tmp_path / "auto.onnx"), exporter="auto", **io)
    assert report.exporter == "dynamo" and all(v["ok"] for v in report.verification), report.verification
    assert {v["sizes"]["batch"] for v in report.verification} >= {1}
