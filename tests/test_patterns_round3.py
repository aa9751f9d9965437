"""Coverage on first contact, round three (issue #47): each pattern as a small model of its own
(``pattern_models_round3.py``), exported under ``patched()`` and compared with the unpatched eager model at
B=1/T=23, B=3/T=50, B=2/T=9 (the export example is B=2/T=37); the plain export's failure is asserted where
this torch has it. Mostly TorchScript; dynamo only where a pattern needed a patch under it (~5 s each)."""
import pytest
import torch

from onnx_compat.testing import patch_case_tests

from helpers import pattern_cases
from pattern_models_round3 import BuiltinReduction, GroupsFromShape, LenAsBatch, PoolKeepsAnAxis

SIZES = [(1, 23), (3, 50), (2, 9)]


def _padded_batch(B, T, g):
    """x [B, T, 8] and its lengths, the longest filling T (the convention a declared lengths input keeps)."""
    lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, 8, generator=g), lengths


def _btd(B, T, g):
    return (torch.randn(B, T, 8, generator=g),)


_LENGTHS_AXES = {0: {0: "b", 1: "t"}, 1: {0: "b"}}
_SHAPE = "ONNX Runtime gives shape"  # the example's batch baked: B=1 gets two rows
_SPECIALISED = "Got invalid dimensions"  # dynamo specialised the batch
_X = {0: {0: "b", 1: "t"}}

# name: (model, inputs(B, T, gen), dynamic axes, exporters, vanilla failure per exporter on torch 2.13)
CASES = {
    # issue #47, 4: Python's len() and max()/min() over tensors
    "len_of_input_as_batch": (lambda: LenAsBatch("input"), _padded_batch, _LENGTHS_AXES, ("torchscript",),
                              {"torchscript": _SHAPE}),
    "len_of_lengths_as_batch": (lambda: LenAsBatch("lengths"), _padded_batch, _LENGTHS_AXES,
                                ("torchscript", "dynamo"), {"torchscript": _SHAPE, "dynamo": _SPECIALISED}),
    # not declared: no padded dim to read, the maximum is a reduction in the graph
    "builtin_max_of_undeclared_lengths": (lambda: BuiltinReduction("max", declares=False), _padded_batch,
                                          _LENGTHS_AXES, ("torchscript",), {"torchscript": "Split size 1 exceeds"}),
    "builtin_min_of_lengths": (lambda: BuiltinReduction("min"), _padded_batch, _LENGTHS_AXES, ("torchscript",),
                               {"torchscript": "Split size 1 exceeds"}),
    # issue #47, 5: a traced size as a module argument
    "group_norm_groups_from_shape": (GroupsFromShape, _btd, _X, ("torchscript",),
                                     {"torchscript": "Expected node type 'onnx::Constant' for argument 'num_groups'"}),
    "adaptive_pool_keeps_frames": (lambda: PoolKeepsAnAxis((None, 1)), _btd, _X, ("torchscript",),
                                   {"torchscript": "output_size is not constant"}),
    "adaptive_pool_keeps_frames_in_bins": (lambda: PoolKeepsAnAxis((None, 3)), _btd, _X, ("torchscript",),
                                           {"torchscript": "output_size is not constant"}),
    # dynamo writes this one silently wrong at other lengths
    "adaptive_max_pool_keeps_features": (lambda: PoolKeepsAnAxis((1, None), "max"), _btd, _X,
                                         ("torchscript", "dynamo"),
                                         {"torchscript": "output_size is not constant", "dynamo": "mismatch"}),
}

ROUND3_CASES = pattern_cases(CASES, SIZES)
test_round3_export_matches_eager, test_vanilla_round3_fails_as_recorded = patch_case_tests(ROUND3_CASES)


@pytest.mark.parametrize("case", ROUND3_CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    case.assert_eager_untouched()

