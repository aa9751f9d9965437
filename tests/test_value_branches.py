"""A branch on a tensor's value whose sides only bind names, exported as ``torch.where`` of both sides.

``if y.mean() > 0: z = ... else: z = ...`` stops the dynamo exporter ("Could not guard on data-dependent
expression"); TorchScript takes the example's side. When each side only assigns names (no other statement,
no in-place call), eager's result is ``torch.where`` of the two sides whichever way the test goes, so the
non-strict capture is run again with that ``if`` written so (``patches/value_branches.py``; a name one side
does not bind keeps its value there). Checked against the unpatched eager model at sizes whose inputs take
each side (B=1 shifted below zero, B=3 above), with the function's own code back after the export.
"""
import pytest
import torch

from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models import ValueBranch, ValueSelect

SIZES = ((1, 1), (3, 9), (1, 36), (3, 40))


def _inputs(B, T, seed):
    """Shifted by the batch: B=1 takes the else sides, B=3 the if sides (and the normaliser), B=2 either."""
    x = torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed))
    return (x * 3 + (B - 2) * 4,)


def _where_not_if(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert "Where" in ops and "If" not in ops, f"the branches should be Where nodes: {ops}"


CASE = PatchCase("value_select", ValueSelect, _inputs, {0: {0: "batch", 1: "time"}}, sizes=SIZES, example=(2, 9),
                 exporters=("dynamo",), graph=_where_not_if, atol=1e-5, rtol=1e-4,
                 vanilla={"dynamo": "Could not guard on data-dependent expression"})
test_value_select_exports_as_where, test_vanilla_value_select_stops_dynamo = patch_case_tests([CASE])


def test_both_sides_are_taken_at_the_checked_sizes():
    """The sizes above reach both sides of both branches, so a graph that kept one side fails them."""
    model = ValueSelect().eval()
    with torch.no_grad():
        sides = {(B, bool(model.lin(_inputs(B, T, 0)[0]).mean() > 0)) for B, T in SIZES}
    assert {s for _, s in sides} == {True, False}, sides


def test_code_is_back_after_the_export(tmp_path):
    from onnx_compat.testing import bare_onnx
    import onnx_compat
    code = ValueSelect.forward.__code__
    with torch.no_grad(), onnx_compat.patched():
        bare_onnx(ValueSelect().eval(), _inputs(2, 9, 0), "dynamo", {0: {0: "batch", 1: "time"}})
    assert ValueSelect.forward.__code__ is code


def test_a_branch_that_returns_stays_refused_saying_why():
    """``if (x > 0).all(): return x`` is not a choice of values: the line-naming refusal says why not."""
    from onnx_compat.testing import bare_onnx
    import onnx_compat
    with pytest.raises(Exception) as raised, torch.no_grad(), onnx_compat.patched():
        bare_onnx(ValueBranch(), (torch.randn(2, 5),), "dynamo", {0: {0: "b", 1: "t"}})
    text = str(raised.value) + "".join(str(e) for e in _chain(raised.value))
    assert "not as torch.where of its sides: 'return x' is not an assignment to one name" in text, text[-2000:]


def _chain(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen
