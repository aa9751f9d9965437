"""onnx_compat.testing: its failures name the case and the sizes, and it refuses degenerate references."""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from onnx_compat import testing
from onnx_compat.testing import EagerMismatch, PatchCase, assert_matches_eager, seed_of


class Scale(nn.Module):
    def __init__(self, factor=1.0):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class FirstFrames(nn.Module):
    """Cuts time to its example length in TorchScript (a Python int): the shape differs at other lengths."""

    def forward(self, x):
        return x[:, :int(x.shape[1])] * 2


def _inputs(B, T, seed):
    return (torch.randn(B, T, 4, generator=torch.Generator().manual_seed(seed)),)


def _proto(model):
    return testing.bare_onnx(model, _inputs(2, 7, 0), "torchscript", {0: {0: "batch", 1: "time"}})


def test_a_numeric_mismatch_names_the_case_sizes_and_error():
    proto = _proto(Scale(1.0))
    checks = [({"batch": 1, "time": 5}, _inputs(1, 5, 1)), ({"batch": 3, "time": 50}, _inputs(3, 50, 2))]
    with pytest.raises(EagerMismatch, match=r"^scale: ONNX Runtime differs from eager at batch=1, time=5: "
                                            r"max abs err [\d.e-]+ \(atol 1e-05, rtol 0.0001\)") as info:
        assert_matches_eager(proto, Scale(1.5), checks, atol=1e-5, rtol=1e-4, name="scale")
    assert info.value.sizes == {"batch": 1, "time": 5} and info.value.max_error > 0.1


def test_a_shape_mismatch_names_the_sizes():
    proto = _proto(FirstFrames())
    with pytest.raises(EagerMismatch, match=r"^cut: ONNX Runtime gives shape \(2, 7, 4\), eager \(2, 9, 4\) "
                                            r"at batch=2, time=9$") as info:
        assert_matches_eager(proto, FirstFrames(), [({"batch": 2, "time": 9}, _inputs(2, 9, 1))],
                             atol=1e-5, rtol=1e-4, name="cut")
    assert info.value.case == "cut"


def test_a_degenerate_reference_is_refused_even_when_both_agree():
    proto = _proto(Scale(0.0))
    with pytest.raises(EagerMismatch, match=r"zeros at batch=1, time=5: degenerate reference output"):
        assert_matches_eager(proto, Scale(0.0), [({"batch": 1, "time": 5}, _inputs(1, 5, 1))],
                             atol=1e-5, rtol=1e-4, name="zeros")


def test_the_degenerate_floor_is_relative_to_the_output():
    """A constant of 1e4 plus round-off-sized noise is degenerate; a small output that varies is not."""
    noise = torch.randn(100, generator=torch.Generator().manual_seed(0)).numpy()
    with pytest.raises(AssertionError, match="degenerate"):
        testing.assert_not_degenerate(1e4 + 1e-3 * noise, "offset")
    testing.assert_not_degenerate(1e-2 * noise, "small")


def test_seeds_do_not_depend_on_the_process():
    code = "from onnx_compat.testing import seed_of; print(seed_of('lstm_1_uni_batch_first'))"
    seeds = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": salt}).stdout.strip() for salt in ("1", "2")}
    assert seeds == {str(seed_of("lstm_1_uni_batch_first"))}
    assert seed_of("a") != seed_of("b")


def test_a_patch_case_checks_unseen_sizes_with_its_own_seeds():
    case = PatchCase("scale", lambda: Scale(2.0), _inputs, {0: {0: "batch", 1: "time"}})
    sizes = [sizes for sizes, _ in case.checks()]
    assert {"batch": 1, "time": 23} in sizes and all(s != dict(batch=2, time=37) for s in sizes)
    model = case.model()
    case.assert_matches(case.export(model, "torchscript"), model)


def _params(test):
    """The (case, exporter) ids a generated test is parametrized with."""
    return [param.id for mark in test.pytestmark if mark.name == "parametrize" for param in mark.args[1]]


def test_a_case_runs_with_its_exporters_only_and_its_records_there():
    both = PatchCase("both", lambda: Scale(2.0), _inputs, {0: {0: "batch", 1: "time"}},
                     vanilla={"torchscript": "x", "dynamo": "y"})
    one = PatchCase("one", lambda: Scale(2.0), _inputs, {0: {0: "batch", 1: "time"}}, exporters=("torchscript",),
                    vanilla={"torchscript": "x", "dynamo": "y"})
    patched_test, vanilla_test = testing.patch_case_tests([both, one])
    expected = [f"both-{e}" for e in testing.EXPORTERS] + ["one-torchscript"]
    assert _params(patched_test) == expected
    assert _params(vanilla_test) == [f"both-{e}" for e in ("dynamo", "torchscript")] + ["one-torchscript"]


def test_the_unpatched_export_runs_in_the_case_context():
    """``unpatched``: the vanilla check runs inside it (here one patch left out; the export is right without it,
    so the recorded failure is missing and that is an error)."""
    import onnx_compat
    entered = []

    def without_conv_padding():
        entered.append(1)
        return onnx_compat.patched(exclude=["conv_padding"])

    case = PatchCase("scale", lambda: Scale(2.0), _inputs, {0: {0: "batch", 1: "time"}}, exporters=("torchscript",),
                     vanilla={"torchscript": "never"}, unpatched=without_conv_padding)
    _, vanilla_test = testing.patch_case_tests([case])
    with pytest.raises(AssertionError, match="the unpatched export worked"):
        vanilla_test(case, "torchscript")
    assert entered == [1]


def test_eager_untouched_compares_every_output_bit_for_bit():
    PatchCase("scale", lambda: Scale(2.0), _inputs, {0: {0: "batch", 1: "time"}}).assert_eager_untouched()
