"""Issue #47 round three, recurrent loops that store each step at its index (``tests/pattern_models_round3g.py``).

xlstm's vanilla sLSTM backend steps ``for i, Wx_t in enumerate(x.unbind(dim=0))`` and writes ``g[i] = gates``,
``states_all[:, i + 1] = states`` into buffers made before the loop; sru's naive CPU path writes
``h[t, :, di, :] = h_t`` inside ``for t in range(L)``. The scan lift refused both ("its loop variable is not a
single name", "its body stores into ..."). A store at the step's index into a tensor the loop does not read is
now a step output written once after the scan, and ``enumerate()`` of the steps gives the step its index. Checked
under dynamo against the unpatched eager model at T=1, the example's length and 4x it (B=1 included); the lift
runs in eager against the Python loop itself; TorchScript still unrolls and names the loop's line.
"""
import ast
import contextlib
import sys

import pytest
import torch

import onnx_compat
from onnx_compat.errors import ExportError, NotLiftable
from onnx_compat.patches import scan_loops
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3g import RecurrentStores, StabilisedCell, StoredStepsCell

SIZES = ((1, 1), (3, 9), (1, 36), (2, 36))  # T=1, the example's length at other batches, 4x the example


def _inputs(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _scans(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Scan") + ops.count("Loop") == 3, f"the three loops should be graph loops: {ops}"


STORES = PatchCase("recurrent_stores", RecurrentStores, _inputs, {0: {0: "batch", 1: "time"}},
                   sizes=SIZES, example=(2, 9), exporters=("dynamo",), graph=_scans, atol=1e-5, rtol=1e-4,
                   grad_mode=contextlib.nullcontext)  # as export() runs it: the closures need grad
test_stores_at_the_step_index_export_as_scans, _ = patch_case_tests([STORES])


def _one_scan(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Scan") + ops.count("Loop") == 1 and "If" not in ops, f"one graph loop, no branch: {ops}"


# xlstm's sLSTM step: a branch on the state's value in the function the loop calls (the plain export stops there)
STABILISED = PatchCase("stabilised_cell", StabilisedCell, _inputs, {0: {0: "batch", 1: "time"}}, sizes=SIZES,
                       example=(2, 9), exporters=("dynamo",), graph=_one_scan, atol=1e-5, rtol=1e-4,
                       vanilla={"dynamo": "Could not guard on data-dependent expression"})
test_a_value_branch_in_a_step_exports_as_where, test_vanilla_value_branch_stops_dynamo = \
    patch_case_tests([STABILISED])


def test_torchscript_names_the_enumerated_loop(tmp_path):
    """TorchScript unrolls the loop at the example's 9 steps; the failed verification names its line."""
    from onnx_compat import Dim, TensorSpec
    b, t = Dim("batch"), Dim("time")
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(StoredStepsCell().eval(), str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 8])],
                           [TensorSpec("all", [b, t, 2, 8]), TensorSpec("last", [b, 8]),
                            TensorSpec("g", [b, 2, t, 8])], exporter="torchscript")
    line = next(n.lineno for n in ast.walk(ast.parse(open(sys.modules[StoredStepsCell.__module__].__file__).read()))
                if isinstance(n, ast.For) and "enumerate" in ast.unparse(n.iter))
    assert f"pattern_models_round3g.py:{line}" in str(raised.value), str(raised.value)[-1500:]


# --- the lift in eager: the same numbers as the Python loop ----------------------------------------------

class Lifter:
    @staticmethod
    def unbind(x, dim):
        frame = sys._getframe(1)
        loop = scan_loops.loop_at(frame)
        xs = x.movedim(dim, 0)
        enumerated = scan_loops.check_unbound(loop, False)
        scan_loops.lift(frame, loop, (torch.arange(x.shape[dim]), xs) if enumerated else xs)
        return ()

    @staticmethod
    def size(x, dim):
        frame = sys._getframe(1)
        loop = scan_loops.loop_at(frame)
        scan_loops.lift(frame, loop, scan_loops.scanned_range(loop, x.shape[dim]), by_index=True)
        return 0


class Plain:
    unbind = staticmethod(lambda x, dim: x.unbind(dim))
    size = staticmethod(lambda x, dim: x.shape[dim])


def shifted_store(x, u):
    out = torch.zeros(x.shape[0], x.shape[1] + 2, 3)
    h = x[:, 0] * 0
    for t in range(u.size(x, 1)):
        h = torch.tanh(h + x[:, t])
        out[:, t + 2, 1:] = h[:, :2]
    return out, h


def enumerated_store(x, u):
    acc, kept = x[0] * 0, torch.ones(x.shape[0] + 1, 2, x.shape[1], x.shape[2])
    for i, x_t in enumerate(u.unbind(x, 0)):
        acc = acc * 0.5 + x_t
        kept[i + 1, 1] = acc * x[i]
    return kept, acc


@pytest.mark.parametrize("steps", [1, 2, 7])
def test_stores_at_the_step_index_compute_what_the_python_loop_computes(steps):
    """Stores at ``t + 2`` after slices, a sliced value dim, an int part after the index, and ``x[i]`` read by
    enumerate()'s index: the scan's outputs written after it are the loop's stores."""
    x = torch.randn(steps, 4, 3, generator=torch.Generator().manual_seed(steps))
    for fn, arg in ((shifted_store, x.transpose(0, 1)), (enumerated_store, x)):
        for want, got in zip(fn(arg, Plain), fn(arg, Lifter)):
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6), (fn.__name__, steps)


def store_read_in_the_loop(x, u):
    out = torch.zeros(x.shape[0], x.shape[1])
    for t in range(u.size(x, 1)):
        out[:, t] = x[:, t] + out.sum(1)
    return out


def store_at_a_step_set_index(x, u):
    out, h = torch.zeros(x.shape[0], x.shape[1]), x[:, 0] * 0
    for t in range(u.size(x, 1)):
        k = t
        h = h + x[:, t]
        out[:, k] = h
    return out


@pytest.mark.parametrize("fn,why", [(store_read_in_the_loop, r"stores into out\[:, t\]"),
                                    (store_at_a_step_set_index, r"stores into out\[:, k\]")])
def test_a_store_the_scan_cannot_write_after_it_is_refused(fn, why):
    """A buffer the body also reads would need each step's earlier stores (a carry), and an index other than
    the step's own is not known to be one slot a step."""
    with pytest.raises(NotLiftable, match=why):
        fn(torch.randn(2, 5), Lifter)


def stacked_into_its_own_name(x, u):
    h, hs = x[:, 0] * 0, []
    for t in range(0, u.size(x, 1)):
        h = x[:, t] * h + x[:, t]
        hs.append(h)
    hs = torch.stack(hs, dim=1)
    return hs * 2


@pytest.mark.parametrize("steps", [1, 6])
def test_a_list_stacked_into_its_own_name_is_read_as_the_stack(steps):
    """mambapy's sequential selective scan (``mamba.py:317-323``): ``hs = torch.stack(hs, dim=1)`` and then
    ``hs`` read as a tensor; the lift refused the read ("the list 'hs' is used at line ... other than as
    torch.stack")."""
    x = torch.randn(3, steps, 4, generator=torch.Generator().manual_seed(steps))
    want, got = stacked_into_its_own_name(x, Plain), stacked_into_its_own_name(x, Lifter)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)


def _stabilised(x_t, n):
    if torch.all(n == 0.0):
        m = x_t
    else:
        m = torch.maximum(x_t, n)
    return n + torch.tanh(m)


def value_branch_in_the_cell(x, u):
    n = x[0] * 0
    for x_t in u.unbind(x, 0):
        n = _stabilised(x_t, n)
    return n


def value_branch_in_the_body(x, u):
    n = x[0] * 0
    for x_t in u.unbind(x, 0):
        if torch.all(n == 0.0):
            m = x_t
            k = m * 2
        else:
            m = torch.maximum(x_t, n)
            k = m - n
        n = n + torch.tanh(m) + k
    return n


def _unpaired(x_t, n):
    if torch.all(n == 0.0):
        m = x_t
    else:
        m = torch.maximum(x_t, n)
        n = n * 2
    return n + torch.tanh(m)


def _loop_over(cell):
    def run(x, u):
        n = x[0] * 0
        for x_t in u.unbind(x, 0):
            n = cell(x_t, n)
        return n
    return run


@pytest.mark.parametrize("steps", [1, 2, 7])
@pytest.mark.parametrize("fn", [value_branch_in_the_cell, value_branch_in_the_body, _loop_over(_unpaired)],
                         ids=("in_the_cell", "in_the_body", "one_side_binds"))
def test_a_value_branch_in_the_step_is_taken_as_where(fn, steps):
    """xlstm's sLSTM cell (``slstm.py:25``): ``if torch.all(n == 0.0)`` picks the first step's stabiliser. A
    scan step cannot branch on a value; both sides only bind names, so the step takes ``torch.where`` of them
    (in the function the step calls, and in the loop's own body, where a later assignment of a side reads the
    side's earlier one; a name one side does not bind keeps its value there): the Python loop's numbers at 1, 2
    and 7 steps, both sides taken over the steps. The function's own code is back after the lift."""
    x = torch.randn(steps, 2, 3, generator=torch.Generator().manual_seed(steps))
    code = _stabilised.__code__
    want, got = fn(x, Plain), fn(x, Lifter)
    assert _stabilised.__code__ is code and "__onnx_compat_where__" not in globals()
    assert want.abs().max() > 0 and got.shape == want.shape and torch.allclose(got, want, atol=1e-6), steps


def _unpacked(x_t, n):
    if torch.all(n == 0.0):
        m, k = x_t, n
    else:
        m, k = torch.maximum(x_t, n), x_t
    return n + torch.tanh(m) + k


def _in_place(x_t, n):
    if torch.all(n == 0.0):
        m = x_t.clone()
    else:
        m = n.add_(x_t)
    return n + torch.tanh(m)


@pytest.mark.parametrize("cell,why", [(_unpacked, "'m, k = (x_t, n)' is not an assignment to one name"),
                                      (_in_place, "'n.add_(x_t)' changes a tensor in place")])
def test_a_value_branch_that_is_not_a_choice_of_values_is_refused_at_its_line(cell, why):
    """Sides that unpack into several names, or change a tensor in place, are not a ``torch.where`` of values:
    the refusal names the branch's line, why it stays a branch, and the form a step can hold."""
    line = cell.__code__.co_firstlineno + 1
    with pytest.raises(NotLiftable) as raised:
        _loop_over(cell)(torch.randn(4, 2, 3), Lifter)
    text = str(raised.value)
    assert f"Data-dependent branching at {__file__}:{line} (if torch.all(n == 0.0):)" in text, text
    assert f"not as torch.where: {why}" in text and "torch.where(cond, a, b)" in text, text


def test_a_range_taken_off_the_for_line_is_refused_saying_so():
    """A range met off any ``for`` line, not bound to a name a later ``for`` iterates (sru's bound form is
    written in its ``for`` for the capture: tests/test_range_forms.py): the refusal says so, not "its iterable is
    not range(size)" of a loop it never found."""
    with pytest.raises(NotLiftable, match=r"range\(\) is not taken on a 'for' line, nor bound to a name that a later"):
        scan_loops.scanned_range(None, 37)
