"""Branches on sizes under dynamo.

Issue #47 item 9 (torchaudio's HDemucs, ``_hdemucs.py:158``): a pad to a multiple behind a branch on the size.

``if not le % stride == 0: x = F.pad(x, (0, stride - le % stride))``: both exporters took the example's side, so
at a length that is a multiple the graph padded a whole stride (one frame too many). Under dynamo the capture runs
again with the pad made at every size, by zero where the branch is not taken (``patches/size_branches.py``).
Checked against the unpatched eager model at lengths that are and are not multiples of the stride (B=1
included), three spellings of the condition.

Issue #47 pattern 2 (mambapy's Jamba, ``jamba.py:503``): a mixture-of-experts loop that skips an expert no frame
was routed to, ``if top_x.shape[0] == 0: continue``, a size only the data decides: dynamo stops at the guard;
the capture runs again with the rest of the step run on the empty selection (``patches/empty_skips.py``); its
frames gathered by Python lists (``top_x.tolist()``, ``jamba.py:507``) are gathered by the index tensor
(``patches/index_lists.py``).
Checked at sizes where experts go empty (one frame, top-2 of 6), and a step that is not a no-op on an empty
selection (a mean: NaN) is caught by verification, not written.

Block attention pads the same way with more in the branch (transformers' Granite speech encoder: a mask built and
filled behind a second ``if remainder > 0:``; nystrom-attention: the width named, the padding mask padded behind an
``if`` of its own). Dynamo keeps the example's side, wrong at every multiple of the block (transformers' Granite
encoder: max abs err 0.004; Nyströmformer: a Reshape fails); the body runs at every size with each pad's widths
and each fill's mask times the condition as 1 or 0.
"""
import ast
import os

import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.patches import empty_skips, size_branches
from onnx_compat.testing import PatchCase, patch_case_tests

from helpers import EXPORTERS, line_of
from pattern_models_round3h import ExpertSkip, PaddedBlocks, PadToMultiple

# T=48 and 72 are multiples of the stride (no pad in eager), 33 and 50 are not; the example 50 pads
SIZES = ((1, 48), (3, 33), (2, 72))


def _wave(B, T, seed):
    return (torch.randn(B, 2, T, generator=torch.Generator().manual_seed(seed)),)


def _case(form, vanilla):
    return PatchCase(f"pad_to_multiple_{form}", lambda: PadToMultiple(form), _wave, {0: {0: "batch", 2: "time"}},
                     sizes=SIZES, example=(2, 50), exporters=("dynamo",), atol=1e-5, rtol=1e-4, vanilla=vanilla)


# plain dynamo keeps the example's pad at every length: ONNX Runtime's shapes differ at a multiple; where the
# width is computed first (0 at a multiple) the example's side is right at every length, and stays right
SHAPE = {"dynamo": "ONNX Runtime gives shape"}
CASES = [_case("hdemucs", SHAPE), _case("width_first", {}), _case("truth", SHAPE)]
test_a_pad_behind_a_size_branch_exports_both_sides, test_vanilla_pad_branch_takes_the_example_side = \
    patch_case_tests(CASES)


def _frames_of(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _blocks_case(form, vanilla):
    return PatchCase(f"padded_blocks_{form}", lambda: PaddedBlocks(form), _frames_of, {0: {0: "batch", 1: "time"}},
                     sizes=SIZES, example=(2, 50), exporters=("dynamo",), atol=1e-5, rtol=1e-4, vanilla=vanilla)


# plain dynamo (torch 2.13): the Granite form stops in onnx_ir's passes after inlining (as transformers' model
# does; under patched() that is mended, and then the example's side fails at multiples: max abs err 1.4); the
# landmarks form keeps the example's pad, so at T = 48 and 72 a Reshape gets a whole block too many
BLOCK_CASES = [_blocks_case("granite", {"dynamo": "An error occurred when running the"}),
               _blocks_case("landmarks", {"dynamo": "Reshape"})]
test_a_masked_pad_behind_a_size_branch_exports_both_sides, test_vanilla_masked_pad_branch_takes_the_example_side = \
    patch_case_tests(BLOCK_CASES)


def test_the_indicators_are_the_comparisons():
    """Each comparison as 1 or 0 in integer arithmetic, at sizes on both sides of it (plain ints here; the graph
    gets the same expressions of its sizes)."""
    ops = {"Lt": int.__lt__, "LtE": int.__le__, "Gt": int.__gt__, "GtE": int.__ge__, "Eq": int.__eq__,
           "NotEq": int.__ne__}
    for op, compare in ops.items():
        for a, b in ((3, 5), (5, 5), (7, 5), (0, 0), (-2, 0)):
            assert size_branches.indicator(op, a, b) == int(compare(a, b)), (op, a, b)
    assert [size_branches.indicator("truth", a) for a in (0, 3)] == [0, 1]


def test_only_pads_and_fills_behind_comparisons_of_sizes_are_rewritten():
    """Pads, masked fills, names bound there alone (items set on them) and ifs of them are; anything else stays as
    it was (the example's side, as before): an else, a name the function binds elsewhere too (``x = x * 2`` after
    the pad: run where the branch is not taken it would change ``x``), another statement, and/or (Python decides it
    at the example), a call in the condition (its value may not be a size)."""
    forms = {
        "if le % 4 != 0:\n    x = F.pad(x, (0, 4 - le % 4))\n": None,
        "if r > 0:\n    p = 4 - r\n    x = F.pad(x, (p, 0))\n    if m is not None:\n        m = F.pad(m, (p, 0))\n": None,
        "if r > 0:\n    k = torch.ones(4, 4)\n    k[:r, :r] = 0\n    s[3::4].masked_fill_(k, -1e4)\n": None,
        "if r > 0:\n    x = x.masked_fill(k, 0.0)\n": None,
        "if le % 4 != 0:\n    x = F.pad(x, (0, 4 - le % 4))\nelse:\n    x = x * 2\n": "has an else",
        "if le % 4 != 0:\n    y = F.pad(x, (0, 1))\n": "no pad or masked fill",
        "if r > 0:\n    x = F.pad(x, (0, 1))\n    x = x * 2\n": "binds elsewhere",
        "if r > 0:\n    x = F.pad(x, (0, 1))\n    print(x)\n": "not a pad, a masked fill",
        "if r > 0:\n    x = F.pad(x, (0, 1))\n    y[0] = 1\n": "not a pad, a masked fill",
        "if le % 4 != 0 and le > 8:\n    x = F.pad(x, (0, 1))\n": "and/or",
        "if torch.jit.is_tracing():\n    x = F.pad(x, (0, 1))\n": "calls a function",
    }
    _rewritten_forms(size_branches._why_not, forms)


def test_an_early_return_is_folded_only_where_the_later_return_is_the_same():
    """``if c: return E`` then pads and ``return E`` again is ``if not c:`` the pads, then ``return E``, whatever
    the sizes: folded and run at every size. Another value returned later (local-attention's ``return False, t``
    then ``return True, F.pad(...)``), another statement on the way, or no return after it: left as it was."""
    def folded(source):
        definition = ast.parse(source).body[0]
        branch = next(n for n in ast.walk(definition) if isinstance(n, ast.If))
        found = size_branches._early_return(branch, definition)
        return "not this form" if found is None else size_branches._why_not(found[0], definition)
    head = "def f(t, m):\n    r = (-t.shape[-2]) % m\n    if r == 0:\n        return t, m\n"
    assert folded(head + "    t = F.pad(t, (0, 0, 0, r))\n    return t, m\n") is None
    assert folded("def f(t, m):\n    r = t.shape[1] % m\n    if not r:\n        return t\n"
                  "    t = F.pad(t, (0, m - r))\n    return t\n") is None
    for rest in ("    return True, F.pad(t, (0, 0, 0, r))\n",                     # another value
                 "    t = F.pad(t, (0, 0, 0, r))\n    return t * 2, m\n",       # another expression
                 "    t = F.pad(t, (0, 0, 0, r))\n    t = t * 2\n    return t, m\n",  # not only pads
                 "    t = F.pad(t, (0, 0, 0, r))\n"):                            # no return after
        assert folded(head + rest) is not None, rest


def _rewritten_forms(why_not, forms):
    """Each source's first statement is rewritten (None) or refused with the reason given."""
    for source, why in forms.items():
        said = why_not(ast.parse(source).body[0])
        assert (said is None) if why is None else (why in said), (source, said)


# --- a skip of an empty selection ------------------------------------------------------------------------------

def _frames(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _expert_case(test, lists=False):
    return PatchCase(f"expert_skip_{test}" + ("_lists" if lists else ""), lambda: ExpertSkip(test=test, lists=lists),
                     _frames, {0: {0: "batch", 1: "time"}}, sizes=EXPERT_SIZES, example=(2, 23),
                     exporters=("dynamo",), atol=1e-5, rtol=1e-4, vanilla={"dynamo": "data-dependent"})


# one frame routed to 2 of 6 experts leaves 4 of them empty, two frames at least 2: the skipped path is checked
EXPERT_SIZES = ((1, 1), (1, 2), (3, 40))
# "lists": gathered by Python lists of the indices, top_x.tolist() (tolist_as_index, patches/index_lists.py)
# "not": not top_x.numel(); "flag": routed = top_x.shape[0] > 0, if not routed
EXPERT_CASES = [_expert_case("eq"), _expert_case("lt"), _expert_case("not"), _expert_case("flag"),
                _expert_case("eq", lists=True)]
test_an_empty_selection_skip_exports_under_dynamo, test_vanilla_empty_selection_skip_stops_at_the_guard = \
    patch_case_tests(EXPERT_CASES)


def test_the_sizes_leave_experts_empty():
    """The checks above reach the skipped path: at the first two sizes fewer frames x top-k than experts, so some
    expert gets no frame whatever the router says (and, with these weights, at the third too or not)."""
    model = ExpertSkip()
    for B, T in EXPERT_SIZES[:2]:
        assert B * T * model.k < len(model.experts), (B, T)


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="no dynamo exporter here")
def test_a_step_that_is_more_than_a_shortcut_is_caught_by_verification(tmp_path):
    """The rewrite assumes the rest of the step does nothing on an empty selection; a mean over it is NaN there.
    Verification at a size that leaves an expert empty fails, naming it, and nothing is written."""
    path = str(tmp_path / "m.onnx")
    torch.manual_seed(0)
    model = ExpertSkip(mean=True).eval()
    x = torch.randn(1, 1, 8)
    assert torch.isfinite(model(x)).all()  # eager skips the empty experts
    spec = [TensorSpec("x", [Dim("batch"), Dim("time"), 8])]
    # caught at a size that leaves an expert empty: a generated one, or the example of one frame
    with pytest.raises(onnx_compat.ExportError, match=r"sizes \{'batch': \d+, 'time': \d+\}: output 'y' max abs "
                                                     r"err inf .*the graph assumed: \S*pattern_models_round3h\.py:\d+: "
                                                     r"the loop step skipped on an empty selection"):
        onnx_compat.export(model, path, spec, [TensorSpec("y", [Dim("batch"), Dim("time"), 8])],
                           exporter="dynamo", sizes={"batch": 2, "time": 23}, examples=[{"x": x}])
    assert not os.path.exists(path)


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="no dynamo exporter here")
def test_not_of_a_flag_that_says_empty_is_left_to_torch(tmp_path):
    """``if not empty: continue`` skips the experts that got frames: the rewrite is only for a skip of the empty
    selection, so the value asked decides (``Eq(u0, 0)`` here, not "n is not zero") and torch's own guard error
    stands, naming the model's line; nothing is written."""
    path = str(tmp_path / "m.onnx")
    spec = [TensorSpec("x", [Dim("batch"), Dim("time"), 8])]
    line = line_of(ExpertSkip, "if not empty:")
    with pytest.raises(onnx_compat.ExportError, match=rf"data-dependent expression Eq\(u0, 0\).*"
                                                     rf"pattern_models_round3h\.py:{line}\]"):
        onnx_compat.export(ExpertSkip(test="inverted").eval(), path, spec,
                           [TensorSpec("y", [Dim("batch"), Dim("time"), 8])], exporter="dynamo")
    assert not os.path.exists(path)


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="no dynamo exporter here")
def test_the_report_says_what_the_graph_assumes(tmp_path):
    """A verified graph with the skip removed says so beside it: the model's line and what it took for granted."""
    spec = [TensorSpec("x", [Dim("batch"), Dim("time"), 8])]
    report = onnx_compat.export(ExpertSkip().eval(), str(tmp_path / "m.onnx"), spec,
                                [TensorSpec("y", [Dim("batch"), Dim("time"), 8])], exporter="dynamo")
    assert len(report.assumed) == 1 and "pattern_models_round3h.py:" in report.assumed[0], report.assumed
    assert "assumed     " in report.summary() and "empty_selection_skips" in report.summary()


def test_only_a_lone_continue_behind_a_zero_test_is_removed():
    forms = {
        "if n == 0:\n    continue\n": None,
        "if 0 == n:\n    continue\n": None,
        "if n < 1:\n    continue\n": None,
        "if n <= 0:\n    continue\n": None,
        "if not n:\n    continue\n": None,
        "if not x.numel():\n    continue\n": None,
        "if not (n > 0):\n    continue\n": "compared with zero",
        "if not n == 0:\n    continue\n": "compared with zero",
        "if n == 0:\n    continue\nelse:\n    y = 1\n": "lone 'continue'",
        "if n == 0:\n    y = 1\n    continue\n": "lone 'continue'",
        "if n == 1:\n    continue\n": "compared with zero",
        "if n > 0:\n    continue\n": "compared with zero",
    }
    _rewritten_forms(empty_skips.why_not, forms)


@pytest.mark.parametrize("case", EXPERT_CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    """Outside a trace the skip is the model's and tolist() a list, patched or not."""
    case.assert_eager_untouched()
    with onnx_compat.patched():
        assert torch.where(torch.tensor([0, 1, 1]))[0].tolist() == [1, 2]
