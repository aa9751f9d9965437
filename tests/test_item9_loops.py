"""Issue #47 item 9: a loop over segments whose trip count is the same at every length (EnCodec's ``encode``
with no segment set: ``range(0, length, length)``, one step).

Patched dynamo refused it like any ``range()`` of a dynamic size; its steps are now proven the same numbers at
every size (``patches/constant_ranges.py``) and it exports with the length dynamic, checked against the
unpatched eager model at lengths 1, 37 and 148 (B=1 included); without the patches dynamo specialises the
length. A range whose count follows the length (real chunking) is not proven and is refused naming the line.
"""
import ast

import pytest
import sympy
import torch

from onnx_compat.errors import NotLiftable
from onnx_compat.patches import scan_loops
from onnx_compat.patches.constant_ranges import proven_steps
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round3b import WholeLengthSegments


def _wave(B, T, seed):
    return (torch.randn(B, 1, T, generator=torch.Generator().manual_seed(seed)),)


CASES = [PatchCase("whole_length_segments", WholeLengthSegments, _wave, {0: {0: "batch", 2: "time"}},
                   sizes=((1, 1), (3, 37), (2, 148)), vanilla={"dynamo": "Got invalid dimensions"})]
test_one_step_segments_export, test_vanilla_one_step_segments_specialise = patch_case_tests(CASES)


@pytest.fixture(scope="module")
def shape_env():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    env = ShapeEnv()
    return env, env.create_symbol(37, ConstantSource("time"), dynamic_dim=DimDynamic.DYNAMIC)


ZERO = sympy.Integer(0)


@pytest.mark.parametrize("args,steps", [
    (lambda s: [ZERO, s, s], [0]),  # the whole length as the stride: one step
    (lambda s: [sympy.Integer(3), s + 3, s], [3]),
    (lambda s: [ZERO, s, s + 1], [0]),  # ceil(s / (s + 1)) is 1 for every s >= 1 (value ranges)
    (lambda s: [ZERO, s, -s], []),  # no step at any length
    (lambda s: [ZERO, s, sympy.Integer(16)], None),  # chunks of 16: the count follows the length
    (lambda s: [s], None),
    (lambda s: [ZERO, 2 * s, s], None),  # two steps, the second at offset s: not a number
    (lambda s: [s, ZERO, -s], None),  # one step, at s
], ids=["whole", "offset", "longer_stride", "empty", "chunks", "range_n", "two_halves", "at_the_size"])
def test_a_range_is_proven_only_when_its_steps_are_numbers_at_every_size(shape_env, args, steps):
    env, s = shape_env
    assert proven_steps(args(s), env) == steps


def test_a_size_that_may_be_zero_is_still_a_positive_step(shape_env):
    """torch.export gives a declared dim the range [0, oo] (measured on EnCodec's length): at 0 ``range(0, 0, 0)``
    raises in the model's own Python, so the stride is positive wherever the model runs."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    from torch._dynamo.source import ConstantSource
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges
    env, _ = shape_env
    s = env.create_symbol(1200, ConstantSource("length"), dynamic_dim=DimDynamic.DYNAMIC)
    env.var_to_range[s] = ValueRanges(0, int_oo)
    assert proven_steps([ZERO, s, s], env) == [0]
    assert proven_steps([ZERO, s, s - 1], env) is None  # s - 1 may be negative


def test_chunks_of_a_dynamic_length_are_refused_with_what_would_cut_them():
    """With a segment set the loop is real chunking (``range(0, length, 16)``): not a scan, and the reason says
    how to cut fixed-size chunks over a dynamic length."""
    loop = next(n for n in ast.walk(ast.parse("for offset in range(0, length, stride):\n    pass\n"))
                if isinstance(n, ast.For))
    with pytest.raises(NotLiftable, match=r"range\(0, length, stride\) steps through the dim, and its steps were "
                                          r"not proven the same at every size .* x\.unfold\(dim, chunk, stride\)"):
        scan_loops.scanned_range(loop, 37)
