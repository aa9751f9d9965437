"""A check that misses eager float32 by float32 rounding alone is judged against the float64 model
(``pipeline/float_noise.py``): a right graph of an ill-conditioned function passes, with PyTorch's own float32
error recorded; a wrong graph, a noise as large as the output, and a model bound to float32 keep their failure."""
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec, VerificationError

INPUTS, OUTPUTS = [TensorSpec("x", [Dim("b"), Dim("t"), 4])], [TensorSpec("y", [Dim("b"), Dim("t"), 4])]


class Cancelling(nn.Module):
    """``(x + big) - big``: x in exact arithmetic; float32 keeps x only to the spacing of floats near ``big``."""

    def __init__(self, big: float = 1e4, bound_to_float32: bool = False, made_in_forward: bool = False):
        super().__init__()
        self.big, self.bound, self.made = big, bound_to_float32, made_in_forward

    def forward(self, x):
        y = (x + self.big) - self.big
        if self.made:  # a weight made in forward at the default dtype (as a window is): float64 in the copy
            return nn.functional.linear(y, torch.eye(4))
        # a float32 weight made in forward: the float64 copy's linear refuses the mix of dtypes
        return nn.functional.linear(y, torch.eye(4, dtype=torch.float32)) if self.bound else y


def _graph(shift: float = 0.0) -> onnx.ModelProto:
    """``y = x + shift``: the exact function (shift 0), or a wrong one."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 4])
    shift_init = helper.make_tensor("shift", TensorProto.FLOAT, [], [shift])
    graph = helper.make_graph([helper.make_node("Add", ["x", "shift"], ["y"])], "g", [x], [y], [shift_init])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_right_graph_of_an_ill_conditioned_function_passes_against_float64():
    model = Cancelling()
    x = torch.randn(2, 9, 4)
    eager_err = float((model(x) - x).abs().max())
    assert eager_err > 1e-4  # eager float32 itself misses the tolerance: the plain comparison must fail
    results = onnx_compat.verify(_graph(), model, INPUTS, OUTPUTS, example={"b": 2, "t": 9})
    judged = [o for r in results for o in r.outputs]
    assert all(r.ok for r in results) and all(o.float32_noise is not None for o in judged)
    assert all(o.max_abs_err > 1e-4 for o in judged)  # against float32 eager: off by its rounding
    assert all(o.max_abs_err_float64 < 1e-6 and 1e-4 < o.float32_noise < 1e-3 for o in judged), judged


def test_tensors_made_in_forward_at_the_default_dtype_are_made_in_float64():
    """``torch.eye(4)`` in ``forward`` (a window, an identity): the float64 copy makes it in float64, so the model
    is judged (it kept its failure when the copy ran at the default float32: a mix of dtypes)."""
    results = onnx_compat.verify(_graph(), Cancelling(made_in_forward=True), INPUTS, OUTPUTS, example={"b": 2, "t": 9})
    assert all(r.ok for r in results) and all(o.float32_noise is not None for r in results for o in r.outputs)
    assert torch.get_default_dtype() == torch.float32  # put back


def test_a_graph_as_far_from_float64_as_eager_passes():
    """The graph's rounding is of the size of eager's, not below it: a graph off by more than eager's own float32
    error (but within twice it) passes; the wrong graph below (1e-2) does not."""
    results = onnx_compat.verify(_graph(shift=7e-4), Cancelling(), INPUTS, OUTPUTS, example={"b": 2, "t": 9})
    judged = [o for r in results for o in r.outputs]
    assert all(r.ok for r in results)
    assert any(o.max_abs_err_float64 > o.float32_noise for o in judged), judged


@pytest.mark.parametrize("why,model,graph", [
    ("a wrong graph", Cancelling(), _graph(shift=1e-2)),
    ("noise as large as the output", Cancelling(big=1e7), _graph()),
    ("a model that does not compute in float64", Cancelling(bound_to_float32=True), _graph()),
], ids=["wrong_graph", "noise_share", "bound_to_float32"])
def test_what_float64_cannot_excuse_stays_failed(why, model, graph):
    with pytest.raises(VerificationError, match="max abs err"):
        onnx_compat.verify(graph, model, INPUTS, OUTPUTS, example={"b": 2, "t": 9})


def test_the_report_says_which_outputs_passed_against_float64():
    """The verified lines of a report name the float64 comparison and PyTorch's own float32 error."""
    from onnx_compat import Report
    results = onnx_compat.verify(_graph(), Cancelling(), INPUTS, OUTPUTS, example={"b": 2, "t": 9})
    report = Report(path="m.onnx", verification=[r.to_dict() for r in results])
    lines = [line for line in report.summary().splitlines() if line.startswith("verified")]
    assert len(lines) == 3 and all("against float64 eager, whose own float32 error is" in line for line in lines)


def test_a_check_asked_with_no_tolerance_keeps_its_failure():
    """``atol=0, rtol=0`` asks for eager's float32 numbers exactly: not re-judged against float64 (the right graph
    that passes at the default tolerance, above, fails here)."""
    with pytest.raises(VerificationError, match="max abs err"):
        onnx_compat.verify(_graph(), Cancelling(), INPUTS, OUTPUTS, example={"b": 2, "t": 9}, atol=0.0, rtol=0.0)


def test_a_model_past_the_copy_limit_keeps_its_failure(monkeypatch):
    """The float64 copy doubles the weights' memory: past ``LARGEST_COPY`` it is not made."""
    from onnx_compat.pipeline import float_noise
    monkeypatch.setattr(float_noise, "LARGEST_COPY", -1)
    with pytest.raises(VerificationError, match="max abs err"):
        onnx_compat.verify(_graph(), Cancelling(), INPUTS, OUTPUTS, example={"b": 2, "t": 9})
