"""What round five of the sweep found, as patterns (docs/sweep.md): an FFT length rounded up by scipy's
``next_fast_len`` and a size to a negative power. Each checked against the unpatched eager model at new sizes,
B = 1 included, one of them far past the example (a frozen FFT length holds near the example only)."""
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round5 import FastLengthConvolution, SizeReciprocal
import torch


def _x(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


CASES = [
    # unpatched, TorchScript has no rfft and dynamo fails in scipy's lru_cache of the length; patched before
    # this, TorchScript froze the example's FFT length: right near the example, and past it the input was cut
    PatchCase("fast_fft_length", FastLengthConvolution, _x, {0: {0: "batch", 1: "time"}},
              sizes=((1, 23), (3, 150), (2, 9)), vanilla={"torchscript": "aten::fft_rfft", "dynamo": "unhashable type: non-nested SymInt"},
              atol=1e-4, rtol=1e-3),
    # TorchScript's traced size is an int64 tensor, which torch refuses to a negative power; dynamo takes it as a float
    PatchCase("size_reciprocal", SizeReciprocal, _x, {0: {0: "batch", 1: "time"}},
              vanilla={"torchscript": "Integers to negative integer powers"}, atol=1e-4, rtol=1e-3),
]
test_round5_pattern_exports, test_round5_vanilla_fails_as_recorded = patch_case_tests(CASES)


def test_eager_is_untouched_inside_patched():
    for case in CASES:
        case.assert_eager_untouched()
