"""The op tail: each case under both exporters, ONNX Runtime
against the unpatched eager model at new batch and length sizes (B=1 too), and each vanilla failure
asserted where it happens, so a patched test cannot pass by accident."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.models.op_tail_cases import CASES, SplitBySize
from onnx_compat.testing import assert_matches_eager, patch_case_tests

from helpers import EXPORTERS, export

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


# --- a split by a size (split_size_folding) ---------------------------------------------------------------------

def _halves_checks():
    """Even lengths other than the example's 36, B=1 included."""
    return [({"batch": b, "time": t}, (torch.randn(b, t, 8, generator=torch.Generator().manual_seed(seed)),))
            for seed, (b, t) in enumerate(((1, 24), (3, 50), (2, 10)), start=1)]


def _export_halves(model):
    half = torch.export.Dim("half", min=1, max=512)
    return torch.onnx.export(model, (torch.randn(2, 36, 8),), dynamo=True, input_names=["x"],
                             dynamic_shapes=({0: torch.export.Dim("batch"), 1: 2 * half},)).model_proto


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="the dynamo exporter's graph optimiser")
def test_a_split_by_a_size_exports_under_dynamo(tmp_path):
    """``x.split(x.shape[1] // 2)``: patched, the ``SplitToSequence`` of a 0-d size is left unfolded and splits at
    every even length, through a plain ``torch.onnx.export`` and through ``export()`` with a multiple declared."""
    model = SplitBySize().eval()
    with onnx_compat.patched():
        proto = _export_halves(model)
    assert_matches_eager(proto, model, _halves_checks(), atol=1e-5, rtol=1e-4, name="split_by_size")
    assert "SplitToSequence" in {n.op_type for n in proto.graph.node}
    b, t = Dim("batch"), Dim("time", multiple=2, min=2, example=36)
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 8])],
                                [TensorSpec("y", [b, Dim("half"), 16])], exporter="dynamo")
    assert report.exporter == "dynamo" and len(report.verification) == 3
    assert all(c["ok"] for c in report.verification) and report.degenerate == []
    assert all(c["sizes"]["time"] % 2 == 0 and c["sizes"]["time"] != 36 for c in report.verification)


@pytest.mark.torch_facts
def test_vanilla_split_by_a_size_stops_in_constant_folding():
    """Unpatched, onnxscript's folding of that ``SplitToSequence`` stops the export (where it does)."""
    try:
        _export_halves(SplitBySize().eval())
    except Exception as exc:
        chain, seen = [], exc
        while seen is not None:
            chain.append(str(seen))
            seen = seen.__cause__ or seen.__context__
        assert any("SplitToSequence" in text for text in chain), chain[-1][:300]
        return
    pytest.skip("this torch and onnxscript export a split by a size unpatched")
