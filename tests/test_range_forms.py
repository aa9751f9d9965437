"""Issue #47, sru's recurrence (``tests/pattern_models_round3h.py``): the loop forms its naive CPU path writes.

A backward direction (``range(T - 1, -1, -1)``, ``reversed(range(T))``), the range bound to a name before its
``for`` (captured again with the range in the ``for``: ``patches/range_names.py``), each step's inputs cut before
the loop by ``.chunk(T)`` and read ``u[t]``, a state made ``[B, D]`` that the first step makes ``[1, B, D]`` (that
step runs before the scan), a step output stored with broadcasting, the last ``c_t`` read after the loop. Each
exported by dynamo as ONNX ``Scan`` and checked against the unpatched eager model at T=1, the example's length
and 4x it (B=1 included); the lift itself runs in eager against the Python loop.
"""
import sys

import pytest
import torch

from onnx_compat.errors import NotLiftable
from onnx_compat.patches import range_names, scan_loops
from onnx_compat.patches.source_rewrites import parsed_at
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3h import BoundRangeCell, TwoWayCell

SIZES = ((1, 1), (3, 9), (1, 36), (2, 36))  # T=1, the example's length at other batches, 4x the example


def _inputs(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _two_scans(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Scan") + ops.count("Loop") == 2, f"each direction should be one graph loop: {ops}"


def _case(name, build, vanilla=None):
    return PatchCase(name, build, _inputs, {0: {0: "batch", 1: "time"}}, sizes=SIZES, example=(2, 9),
                     exporters=("dynamo",), graph=_two_scans, atol=1e-5, rtol=1e-4, vanilla=vanilla or {})


CASES = [_case("counts_down", TwoWayCell), _case("reversed_range", lambda: TwoWayCell(backward="reversed")),
         _case("range_bound_to_a_name", BoundRangeCell, {"dynamo": "Got invalid dimensions"})]
# plain dynamo unrolls the loops at the example's 9 steps: its graph takes no other length
test_both_directions_export_as_scans, test_vanilla_two_way_cell_is_specialised = patch_case_tests(CASES)


# --- the lift in eager: the same numbers as the Python loop ----------------------------------------------

class Plain:
    size = staticmethod(lambda x, d, less=0: x.shape[d])


class RangeLifter:
    """``range(u.size(x, d))`` on a ``for`` line: with ``Plain`` the model's Python loop, with this the same
    loop run as a scan over the range's steps (what ``dynamic_loops`` does while dynamo traces), in eager."""

    @staticmethod
    def size(x, dim, less=0):
        frame = sys._getframe(1)
        loop = scan_loops.loop_at(frame)
        scan_loops.lift(frame, loop, scan_loops.scanned_range(loop, x.shape[dim] - less, frame), by_index=True)
        return scan_loops.emptied_range(loop, frame) + less


def reversed_range(x, w, u):
    h, out = torch.zeros(x.shape[0], 8), torch.zeros(x.shape[0], x.shape[1], 8)
    for t in reversed(range(u.size(x, 1))):
        h = torch.tanh(x[:, t] @ w + h)
        out[:, t] = h
    return out, h


def counting_down(x, w, u):
    h, ys = torch.zeros(x.shape[0], 8), torch.zeros(x.shape[0], x.shape[1], 8)
    for t in range(u.size(x, 1, 1) - 1, -1, -1):
        h = torch.tanh(x[:, t] @ w + h)
        ys[:, t] = h
    return ys, h


def state_grows_on_the_first_step(x, w, u):
    pieces = x.transpose(0, 1).unsqueeze(1)  # [T, 1, B, D]: what chunk(T) of [T, B, D] gives, one tensor
    c = torch.zeros(x.shape[0], 8)  # [B, D]; the step makes it [1, B, D]
    h = torch.zeros(x.shape[1], x.shape[0], 8)
    for t in range(u.size(x, 1)):
        c_t = pieces[t] @ w + c * 0.5
        c = c_t
        h[t, :, :] = c_t  # [1, B, D] stored into a [B, D] slot
    return h, c_t  # the last step's c_t, read after the loop


@pytest.mark.parametrize("fn", [reversed_range, counting_down, state_grows_on_the_first_step], ids=lambda f: f.__name__)
@pytest.mark.parametrize("T", [1, 2, 7])
def test_a_lifted_range_computes_what_the_python_loop_computes(fn, T):
    x, w = torch.randn(3, T, 8), torch.randn(8, 8)
    expected, got = fn(x, w, Plain), fn(x, w, RangeLifter)
    assert expected[0].abs().sum() > 0
    for e, g in zip(expected, got):
        assert g.shape == e.shape and torch.equal(g, e), (fn.__name__, T, (g - e).abs().max())


def state_grows_at_every_step(x, w, u):
    c = torch.zeros(x.shape[0], 8)
    for t in range(u.size(x, 1)):
        c = torch.cat([c, x[:, t] @ w], 1)
    return c


def test_a_state_that_changes_at_every_step_is_not_lifted():
    """Running the first step before the scan helps a state that changes once; one that grows at every step is
    no scan's carry, and the loop stays refused (with why the step did not trace)."""
    with pytest.raises(NotLiftable, match=r"at every step|does not trace as a scan step"):
        state_grows_at_every_step(torch.randn(2, 5, 8), torch.randn(8, 8), RangeLifter)


# --- a range bound to a name: where the rewrite is sound -------------------------------------------------

def _found(source: str, line: int):
    return range_names.bound_loop(parsed_at(source.splitlines(True), 1), line)


@pytest.mark.parametrize("source,why", [
    ("seq = range(n)\nfor t in seq:\n    pass\n", ""),
    ("seq = range(n)\nn = n - 1\nfor t in seq:\n    pass\n", "'n', which the range reads, is bound again"),
    ("seq = range(n)\nfor t in seq:\n    pass\nk = len(seq)\n", "'seq' is bound or read elsewhere"),
    ("seq = range(n)\nif n:\n    for t in seq:\n        pass\n", "no later 'for' of the same block iterates 'seq'"),
    ("a, b = range(n), 1\nfor t in a:\n    pass\n", "the range is not bound to one name"),
], ids=["moved", "rebound_between", "read_elsewhere", "another_block", "unpacked"])
def test_a_range_is_moved_into_its_for_only_where_it_is_the_same(source, why):
    found, said = _found(source, 1)
    assert (found is not None) == (not why) and why in said, said
