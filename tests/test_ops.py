"""The op tail: each case under both exporters, ONNX Runtime
against the unpatched eager model at new batch and length sizes (B=1 too), and each vanilla failure
asserted where it happens, so a patched test cannot pass by accident."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

import onnx_compat
from onnx_compat.models.op_tail_cases import CASES
from onnx_compat.testing import patch_case_tests

from helpers import export

test_patched_export_matches_eager, test_vanilla_export_fails_as_recorded = patch_case_tests(CASES)


@pytest.mark.parametrize("call,error", [
    (lambda x: F.adaptive_avg_pool1d(x, (2, 3)), "adaptive_avg_pool1d"),
    (lambda x: F.adaptive_max_pool2d(x[None], (3, -1)), "negative dimension"),
    (lambda x: x.unfold(2, 3, 0), "step is 0"),
    (lambda x: F.interpolate(x[None], scale_factor=0.5, mode="nearest-exact", antialias=True), "anti-alias"),
    (lambda x: pad_sequence([x[0], x[1, :, :3]]), "size"),
], ids=["pool_2_sizes_for_1d", "pool_to_negative", "unfold_step_0", "antialias_nearest", "pad_unequal_features"])
def test_what_the_patches_cannot_express_raises_pytorchs_error(call, error, exporter):
    """Bad arguments reach PyTorch unchanged: eager and the export fail with PyTorch's error."""
    if "pad_sequence" in repr(call.__code__.co_names) and exporter == "dynamo":
        pytest.skip("torch.onnx retries in strict mode, whose pad_sequence kernel does not check trailing sizes; "
                    "the pipeline's verification catches such a graph")
    class Bad(nn.Module):
        def forward(self, x):
            return call(x)

    x = torch.randn(2, 4, 10)
    with pytest.raises(Exception, match=f"(?i){error}"):
        call(x)
    with onnx_compat.patched(), pytest.raises(Exception) as exported:
        export(Bad(), (x,), exporter, {0: {2: "time"}})
    assert error.lower() in (str(exported.value) + repr(exported.value.__cause__)).lower(), str(exported.value)[:300]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_eager_is_untouched_inside_patched(case):
    """Outside an export the wrappers call straight through: bit-identical outputs."""
    reason = case.skip("eager")
    if reason:
        pytest.skip(reason)
    model = case.model()
    args = case.inputs(3, 20, 5)
    with torch.no_grad():
        expected, again = model(*args), model(*args)
        with onnx_compat.patched():
            got = model(*args)
    if torch.equal(again, expected):
        assert torch.equal(got, expected)
    else:  # this torch's kernel is not bit-reproducible itself (InstanceNorm on torch 2.0)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
