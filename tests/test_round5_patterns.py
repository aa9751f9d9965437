"""What round five of the sweep found, as patterns (docs/sweep.md): an FFT length rounded up by scipy's
``next_fast_len`` and a size to a negative power. Each checked against the unpatched eager model at new sizes,
B = 1 included, one of them far past the example (a frozen FFT length holds near the example only)."""
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_round5 import BoundedTable, EarlyReturnPad, FastLengthConvolution, SizeReciprocal
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
    # simple-hierarchical-transformer's pad to a multiple returns early where nothing is to pad; dynamo took
    # that side at an even example, and the graph cannot reshape an odd length (TorchScript freezes the
    # remainder at the example: refused in export(), naming the line; dynamo only here)
    PatchCase("early_return_pad", EarlyReturnPad, _x, {0: {0: "batch", 1: "time"}}, example=(2, 38),
              sizes=((1, 23), (3, 50), (2, 9)), vanilla={"dynamo": "cannot be reshaped"}, exporters=("dynamo",),
              graph=lambda proto, exporter: _no_indicator(proto)),
]


def _no_indicator(proto):
    """The pad's width is the remainder whose being nonzero is the condition: kept as it is (r * [r != 0] is r),
    no Min/Max of an indicator in the sizes."""
    ops = {n.op_type for n in proto.graph.node}
    assert "Pad" in ops and not ops & {"Min", "Max"}, sorted(ops)
test_round5_pattern_exports, test_round5_vanilla_fails_as_recorded = patch_case_tests(CASES)


def test_eager_is_untouched_inside_patched():
    for case in CASES:
        case.assert_eager_untouched()


# --- a size the trace froze is checked far from the example -----------------------------------------------------

def test_far_sizes_are_one_batch_four_times_the_example_within_bounds():
    from onnx_compat import Dim, TensorSpec
    from onnx_compat.spec import far_sizes, verification_sizes
    b, t = Dim("batch"), Dim("time", max=100)
    inputs = [TensorSpec("x", [b, t, 8])]
    example = {"batch": 2, "time": 37}
    assert far_sizes(inputs, example) == {"batch": 1, "time": 100}
    near = verification_sizes(inputs, example)
    assert far_sizes([TensorSpec("x", [b, Dim("time"), 8])], example, near) == {"batch": 1, "time": 148}
    assert far_sizes([TensorSpec("x", [b, Dim("time", max=50), 8])], example, near) is None  # 53 checked already


def test_a_frozen_size_that_holds_near_the_example_is_caught_far_from_it(tmp_path):
    """The FFT length scipy rounds up, frozen at the example's (the patch that keeps it in the graph set aside):
    the graph passes at the three shapes near the example, and is wrong past it. Where the trace froze a size,
    export() checks once more at B=1 and four times the example's length; the error names that shape and the
    line that froze it, and nothing is written."""
    from onnx_compat import Dim, TensorSpec, export, verify
    from onnx_compat.errors import ExportError
    import pytest
    b, t = Dim("batch"), Dim("time")
    io = dict(inputs=[TensorSpec("x", [b, t, 8])], outputs=[TensorSpec("y", [b, t, 8])])
    model = FastLengthConvolution().eval()
    with pytest.raises(ExportError) as raised:
        export(model, str(tmp_path / "m.onnx"), exporter="torchscript", patches={"exclude": ["fast_fft_lengths"]},
               **io)
    text = str(raised.value)
    frozen = f"pattern_models_round5.py:{FastLengthConvolution.forward.__code__.co_firstlineno + 3}"
    assert "at sizes {'batch': 1, 'time': 148}" in text and "frozen into the graph by Python code at" in text \
        and frozen in text, text[:1500]
    assert not (tmp_path / "m.onnx").exists()
    # the same graph passes at the near shapes: what the far check adds
    import onnx_compat
    with onnx_compat.patched(exclude=["fast_fft_lengths"]):
        torch.onnx.export(model, _x(2, 37, 0), str(tmp_path / "near.onnx"), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "time"}, "y": {0: "batch", 1: "time"}})
    assert all(c.ok for c in verify(str(tmp_path / "near.onnx"), model, **io))


def test_a_far_check_the_model_refuses_is_dropped_not_failed(tmp_path):
    """A model that holds a table only so long refuses the far length: that check is not made, the export
    verifies at the shapes it takes, and the report's findings say which check was not made and why."""
    from onnx_compat import Dim, TensorSpec, export
    b, t = Dim("batch"), Dim("time")
    report = export(BoundedTable(), str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 8])],
                    [TensorSpec("y", [b, t, 8])], exporter="torchscript")
    checked = [c["sizes"]["time"] for c in report.verification]
    assert 148 not in checked and all(c["ok"] for c in report.verification) and report.warnings["baked"], report
    said = [f for f in report.findings if f.startswith("far check at {'batch': 1, 'time': 148} not made")]
    assert len(said) == 1 and "the eager model itself refused it (" in said[0], report.findings


# --- a plain export inside patched() leaves the model as it was ---------------------------------------------------

def test_a_plain_export_inside_patched_leaves_the_model_as_it_was():
    """simple-hierarchical-transformer's attention registers its causal mask as a buffer when a longer sequence
    comes; ``torch.onnx.export`` (dynamo) leaves the trace's fake tensor there, and the sweep's eager run after a
    plain patched export failed on it (``aten.equal``). Inside ``patched()`` the export puts the model back: the
    cache is empty again and eager computes what a fresh copy computes, at new sizes, B = 1 included."""
    import copy
    import numpy as np
    import onnx_compat
    from torch._subclasses.fake_tensor import FakeTensor
    from pattern_models_round5 import KeptCausalMask
    torch.manual_seed(0)
    fresh = KeptCausalMask().eval()
    shapes = dict(dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("time")},), dynamo=True)
    plain = copy.deepcopy(fresh)
    with torch.no_grad():
        torch.onnx.export(plain, _x(2, 37, 0), **shapes)
    left = plain.attend.mask
    model = copy.deepcopy(fresh)
    with torch.no_grad(), onnx_compat.patched():
        torch.onnx.export(model, _x(2, 37, 0), **shapes)
    assert model.attend.mask is None and not model.training, type(model.attend.mask)
    for B, T in ((1, 20), (3, 50)):
        with torch.no_grad():
            got, want = model(*_x(B, T, 1)), copy.deepcopy(fresh)(*_x(B, T, 1))
        assert np.array_equal(got.numpy(), want.numpy()), (B, T)
    if not isinstance(left, FakeTensor):  # a torch that puts the model back itself: the patch is not needed there
        import pytest
        pytest.skip(f"torch {torch.__version__} leaves {type(left).__name__} in the cache by itself")
