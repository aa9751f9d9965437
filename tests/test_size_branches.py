"""Issue #47 item 9 (torchaudio's HDemucs, ``_hdemucs.py:158``): a pad to a multiple behind a branch on the size.

``if not le % stride == 0: x = F.pad(x, (0, stride - le % stride))``: both exporters took the example's side, so
at a length that is a multiple the graph padded a whole stride (one frame too many). Under dynamo the capture runs
again with the pad made at every size, by zero where the branch is not taken (``patches/size_branches.py``).
Checked against the unpatched eager model at lengths that are and are not multiples of the stride (B=1
included), three spellings of the condition.
"""
import torch

from onnx_compat.patches import size_branches
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3h import PadToMultiple

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


def test_the_indicators_are_the_comparisons():
    """Each comparison as 1 or 0 in integer arithmetic, at sizes on both sides of it (plain ints here; the graph
    gets the same expressions of its sizes)."""
    ops = {"Lt": int.__lt__, "LtE": int.__le__, "Gt": int.__gt__, "GtE": int.__ge__, "Eq": int.__eq__,
           "NotEq": int.__ne__}
    for op, compare in ops.items():
        for a, b in ((3, 5), (5, 5), (7, 5), (0, 0), (-2, 0)):
            assert size_branches.indicator(op, a, b) == int(compare(a, b)), (op, a, b)
    assert [size_branches.indicator("truth", a) for a in (0, 3)] == [0, 1]


def test_only_a_lone_pad_behind_comparisons_of_sizes_is_rewritten():
    """Anything else stays as it was (the example's side, as before): an else, another statement, and/or (Python
    decides it at the example), a call in the condition (its value may not be a size)."""
    import ast
    forms = {
        "if le % 4 != 0:\n    x = F.pad(x, (0, 4 - le % 4))\n": None,
        "if le % 4 != 0:\n    x = F.pad(x, (0, 4 - le % 4))\nelse:\n    x = x * 2\n": "without an else",
        "if le % 4 != 0:\n    y = F.pad(x, (0, 1))\n": "without an else",
        "if le % 4 != 0 and le > 8:\n    x = F.pad(x, (0, 1))\n": "and/or",
        "if torch.jit.is_tracing():\n    x = F.pad(x, (0, 1))\n": "calls a function",
    }
    for source, why in forms.items():
        said = size_branches._why_not(ast.parse(source).body[0])
        assert (said is None) if why is None else (why in said), (source, said)
