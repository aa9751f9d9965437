"""Issue #47 round three, structured prediction and time series (``tests/pattern_models_round3e.py``).

A linear-chain CRF's forward algorithm as pytorch-crf writes it (time-first ``[T, B, ...]``, ``for i in
range(1, T)`` carrying a score, ``score += ...`` with ``tags[i - 1]`` and ``emissions[i, arange(B), tags[i]]``,
``if not mask[0].all(): raise``) is run as a scan under dynamo and checked against the unpatched eager model
at T=1 (no step at all), the example's length and 4x it, B=1 included. It is exported with autograd on, as
``export()`` runs it: the check's failed guard used to leave an unbacked read behind, which the scan's
re-trace refused ("Pending unbacked symbols"). Plain TorchScript unrolls it at the example's 10 steps. The
range lift's corner cases run in eager against the Python loop itself.
"""
import ast
import contextlib
import sys

import numpy as np
import pytest
import torch

import onnx_compat
from onnx_compat.errors import NotLiftable
from onnx_compat.patches import scan_loops
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3e import ChainCRFLikelihood

# lengths 1 (range(1, T) runs no step), the example's 11 at another batch, and 4x the example
SIZES = ((1, 1), (3, 11), (2, 44))


def _crf_inputs(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # the longest sequence fills the padded length
    return torch.randn(B, T, 5, generator=g), lengths, torch.randint(0, 5, (B, T), generator=g)


def _scans(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Scan") + ops.count("Loop") == 2, f"both loops should be graph loops: {ops}"


CRF = PatchCase("chain_crf_likelihood", ChainCRFLikelihood, _crf_inputs,
                {0: {0: "batch", 1: "time"}, 1: {0: "batch"}, 2: {0: "batch", 1: "time"}},
                sizes=SIZES, example=(2, 11), exporters=("dynamo",), graph=_scans, atol=1e-4, rtol=1e-4,
                grad_mode=contextlib.nullcontext)  # as export() runs it: the parameters need grad
test_range_from_one_exports_as_a_scan, _ = patch_case_tests([CRF])


def test_plain_torchscript_unrolls_the_forward_algorithm():
    """Recorded failure: the TorchScript trace holds the example's 10 steps, so ONNX Runtime fails at T=1 (a
    Gather of step 10 from a dim of 1)."""
    model = CRF.model()
    proto = CRF.export(model, "torchscript")
    with pytest.raises(Exception, match=r"Gather.*idx=10 must be within the inclusive range \[-1,0\]"):
        CRF.assert_matches(proto, model)


# --- the lift of range(start, T) in eager: the same numbers as the Python loop --------------------------

class Lifter:
    """``for i in range(1, u.size(x, 0))``: with ``u = Plain`` the model's Python loop; with ``Lifter`` the same
    loop run as a scan by ``scan_loops`` (what ``dynamic_loops`` does while dynamo traces), in eager."""

    @staticmethod
    def size(x, dim):
        frame = sys._getframe(1)
        loop = scan_loops.loop_at(frame)
        scan_loops.lift(frame, loop, scan_loops.scanned_range(loop, x.shape[dim]), by_index=True)
        return 0  # range(1, 0): the Python loop runs no step


class Plain:
    @staticmethod
    def size(x, dim):
        return x.shape[dim]


def shifted_reads(x, tags, u):
    score = x[0, torch.arange(x.shape[1]), tags[0]]
    for i in range(1, u.size(x, 0)):
        score += x[i, torch.arange(x.shape[1]), tags[i]] * x[i - 1][:, 0]
    return score


def time_on_dim_one(x, u):
    h = x[:, 0] * 0
    for t in range(2, u.size(x, 1)):
        h = torch.tanh(h + x[:, t] - x[:, t - 2])
    return h


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_range_from_a_constant_start_computes_what_the_python_loop_computes(steps):
    """At T=1 (and T=2 for ``range(2, T)``) the range is empty: the scan still runs one step (ONNX Runtime's
    Scan fails on none) whose result is dropped."""
    g = torch.Generator().manual_seed(steps)
    x, tags = torch.randn(steps, 3, 4, generator=g), torch.randint(0, 4, (steps, 3), generator=g)
    for fn, args in ((shifted_reads, (x, tags)), (time_on_dim_one, (x.transpose(0, 1),))):
        expected, got = fn(*args, Plain), fn(*args, Lifter)
        assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6), (fn.__name__, steps)


def in_place_on_a_shared_state(x, u):
    score = x[0] * 1
    kept = score
    for i in range(1, u.size(x, 0)):
        score += x[i]
    return score + kept


def test_an_in_place_update_seen_by_another_name_is_not_lifted():
    """``score += ...`` is run as ``score = score + ...`` in the step: not when another name holds the tensor
    and would see each step's update."""
    with pytest.raises(NotLiftable, match="updates 'score' in place .* 'kept' is the same tensor"):
        in_place_on_a_shared_state(torch.randn(4, 3), Lifter)


def test_a_range_with_a_computed_start_is_still_refused_with_why():
    loop = next(n for n in ast.walk(ast.parse("for i in range(k, n):\n    pass\n")) if isinstance(n, ast.For))
    with pytest.raises(NotLiftable, match=r"range\(k, n\) steps through the dim"):
        scan_loops.scanned_range(loop, 37)


# --- what no export can be right for: refused naming the line and what would make it exportable -----------

def backtrace_through_item(x, u):
    score, history = x[0], []
    for i in range(1, u.size(x, 0)):
        score, best = (score.unsqueeze(2) + x[i].unsqueeze(1)).max(dim=1)
        history.append(best)
    path = [score[0].argmax().item()]
    for hist in reversed(history):
        path.append(hist[0][path[-1]].item())
    return torch.tensor(path)


def test_a_backtrace_into_python_lists_names_its_value_reads():
    """pytorch-crf's Viterbi decode: the argmax history is walked in Python through ``.item()``. The loop is not
    a scan (its list is read in Python), and the reason names the reads and the tensor form that exports."""
    first = backtrace_through_item.__code__.co_firstlineno
    with pytest.raises(NotLiftable, match=rf"the list 'history' is used at line {first + 6} .*\.item\(\) at line "
                                          rf"{first + 5}, \.item\(\) at line {first + 7}.*torch\.gather"):
        backtrace_through_item(torch.randn(5, 1, 4, 4)[..., 0], Lifter)


def test_autograd_in_forward_is_refused_at_its_line(tmp_path):
    """torch-struct's marginals: plain TorchScript fails with "Cannot insert a Tensor that requires grad as a
    constant" (no line of the model, read as a module kept in a global); patched, the call is named."""
    from onnx_compat import Dim, TensorSpec
    from onnx_compat.errors import ExportError
    from pattern_models_round3e import GradientMarginals
    b, t = Dim("batch"), Dim("time")
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(GradientMarginals(), str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 4, 4])],
                           [TensorSpec("y", [b, t, 4, 4])], exporter="torchscript")
    line = GradientMarginals.forward.__code__.co_firstlineno + 4
    head = str(raised.value).split("also tried")[0]
    assert f"pattern_models_round3e.py:{line}: torch.autograd.grad inside the model's forward" in head, head
    assert "Cannot insert a Tensor that requires grad" in str(raised.value), str(raised.value)[-800:]


def two_loops_one_name(x, u):
    score = x[0]
    for i in range(1, u.size(x, 0)):
        score = score * 0.5 + x[i]
    total = score
    for i in range(x.shape[1]):
        total = total + score[i]
    return total


def test_a_loop_variable_bound_again_by_a_later_loop_is_not_read_after_the_lifted_loop():
    """The later ``for i`` binds ``i`` itself: its reads are not the lifted loop's (the lift refused that loop,
    "'i', set in the loop, is read after it")."""
    x = torch.randn(6, 3)
    expected, got = two_loops_one_name(x, Plain), two_loops_one_name(x, Lifter)
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()


def test_values_of_a_numpy_stand_in_are_refused_by_every_operator():
    """pypots TimesNet (layers.py:24) divides a size by periods read through .numpy(): a bare TypeError before."""
    from onnx_compat.errors import UnsupportedPattern
    from onnx_compat.patches.constants import DtypeOnly
    periods = DtypeOnly(torch.tensor([2, 3]), "model.py:23")
    for use in (lambda: 12 // periods, lambda: periods % 2, lambda: 2 ** periods, lambda: periods < 3):
        with pytest.raises(UnsupportedPattern, match="model.py:23.*fix those sizes"):
            use()
    assert periods.shape == (2,) and periods.dtype == np.int64
