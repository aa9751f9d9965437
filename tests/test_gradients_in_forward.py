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


def test_a_value_check_before_the_gradient_is_kept_as_a_check(tmp_path):
    """``assert max(lengths) <= N`` ahead of the gradient: below autograd a functional tensor's ``bool()`` is
    taken as the check it is (it stopped the capture at a data-dependent guard), and the graph matches the
    unpatched eager model with mixed lengths at new sizes, B = 1 included; zero past each length."""
    import numpy as np
    from onnx_compat.testing import session_of
    from pattern_models_round3e import CheckedMarginals
    t = Dim("time", min=3, example=11)
    report = onnx_compat.export(
        CheckedMarginals(), str(tmp_path / "m.onnx"), exporter="dynamo",
        inputs=[TensorSpec("data", [Dim("batch"), t, 4, 4], lengths=[1], lengths_dtype=torch.int64)],
        outputs=[TensorSpec("marginals", [Dim("batch"), t, 4, 4])])
    assert "value_checks" in report.attempts[-1].acted, report.attempts[-1].acted
    session, model = session_of(str(tmp_path / "m.onnx")), CheckedMarginals().eval()
    g = torch.Generator().manual_seed(7)
    for B, T in ((1, 3), (3, 40), (2, 5)):
        x = torch.randn(B, T, 4, 4, generator=g)
        n = torch.randint(1, T + 1, (B,), generator=g)
        n[0] = T
        want = model(x, n).detach().numpy()
        got = session.run(None, {"data": x.numpy(), "data:size1": n.numpy()})[0]
        assert np.abs(got - want).max() < 1e-5, (B, T, np.abs(got - want).max())
        assert np.abs(want).max() > 0.05 and (want[-1, int(n[-1]):] == 0).all(), (B, T)
