"""Round-three fixes (issue #47), part c: size guards that hold on the whole declared range but that torch's
value ranges cannot decide (clearvoice FRCRN's ``1 % (T//320 - 1) != 0``, music2latent's ``k % (k*frames)``),
a causal mask cached at the context length against a fresh one (xlstm's mLSTM), a log2(T) parallel scan
refused fast at its line (mambapy's pscan), and complex linear algebra (nara-wpe): a solve or inverse as the real
system of twice the order, its strided framing of the spectrum, the rest refused with what is missing.
Small models in ``pattern_models_round3f.py``; exports compared with the unpatched eager model at B=1/T=...,
three sizes the export never saw. One dynamo export per fix."""
import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ExportError, UnsupportedPattern
from onnx_compat.patches.patch import acting
from onnx_compat.patches.range_guards import range_rewritten
from onnx_compat.testing import PatchCase, patch_case_tests
from onnx_compat.versions import HAS_DYNAMO

from pattern_models_round3f import (CachedCausalMask, ComplexSolveFilter, FramedSpectrum, HalvingScan,
                                    StridedPrediction)

dynamo_only = pytest.mark.skipif(not HAS_DYNAMO, reason="needs the dynamo exporter")


def _matches(proto, model, inputs_at, sizes):
    """ONNX Runtime against the unpatched eager model at each size; the sizes that failed, named."""
    session = ort.InferenceSession(proto.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    failed = []
    for size in sizes:
        args = inputs_at(*size)
        with torch.no_grad():
            want = model(*args).numpy()
        got = session.run(None, dict(zip(names, (a.numpy() for a in args))))[0]
        if got.shape != want.shape or not np.allclose(got, want, atol=1e-4, rtol=1e-3):
            failed.append(size)
        assert np.abs(want).max() > 1e-3  # not a degenerate output
    assert not failed, f"ONNX Runtime differs from eager at (B, T) = {failed}"


# --- 1. guards true on the whole range ------------------------------------------------------------------

def test_range_rewrite_decides_what_value_ranges_cannot():
    """``Mod(1, Max(1, n - 1))`` with n >= 5 is 1, ``Min(66, 66n - 66)`` is 66; a Mod whose dividend may reach
    its divisor, and a comparison of the size itself, are left undecided."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod
    from torch.utils._sympy.value_ranges import ValueRanges
    t = sympy.Symbol("t", integer=True, positive=True)
    n = FloorDiv(t, 32)
    ranges = {t: ValueRanges(160, sympy.oo)}
    from torch.utils._sympy.value_ranges import bound_sympy
    guard = sympy.Ne(Mod(1, Max(1, n - 1)), 0)
    assert not bound_sympy(guard, ranges).is_singleton()  # torch's own ranges leave it open
    assert range_rewritten(guard, ranges) == sympy.true
    assert range_rewritten(Min(66, 66 * n - 66), ranges) == 66
    assert range_rewritten(Mod(200, 66 * n - 66), ranges) == 200  # the divisor is at least 264
    assert range_rewritten(Mod(400, 66 * n - 66), ranges) is None  # 400 may exceed it
    assert range_rewritten(sympy.Lt(t, 640), ranges) is None


@dynamo_only
def test_framed_spectrum_exports_with_the_dim_dynamic_and_matches_eager():
    """The conv STFT's views ask guards true for every T >= 96, which torch.export alone refuses ("Constraints
    violated ... satisfy the generated guard"): decided over the range while dynamo exports
    (``range_decided_guards`` acts), the time dim stays dynamic, and the program, translated by torch.onnx,
    matches eager in ONNX Runtime at three new sizes."""
    torch.manual_seed(0)
    model = FramedSpectrum().eval()
    shapes = ({1: torch.export.Dim("t", min=160)},)  # one stream (B=1): with a dynamic batch the views ask other guards
    with onnx_compat.patched(), acting() as acted:
        program = torch.export.export(model, (torch.randn(1, 480),), dynamic_shapes=shapes, strict=False)
    assert "range_decided_guards" in acted
    assert [str(r) for r in program.range_constraints.values()] == ["VR[160, int_oo]"]
    proto = torch.onnx.export(program, dynamo=True).model_proto
    g = torch.Generator().manual_seed(1)
    _matches(proto, model, lambda B, T: (torch.randn(B, T, generator=g),), [(1, 672), (1, 200), (1, 1000)])


# --- 2. a cached mask against a fresh one -----------------------------------------------------------------

def test_cached_causal_mask_holds_at_the_context_length(tmp_path):
    """``S < buffer.size(-1)`` picks the fresh mask at the example (S=9); the graph is checked at S=16, the
    context length, where eager takes the cached buffer instead (the other branch), B=1 first."""
    torch.manual_seed(0)
    model = CachedCausalMask().eval()
    b, t = Dim("b", min=1, example=2), Dim("t", min=4, example=9, max=16)
    path = str(tmp_path / "mask.onnx")
    onnx_compat.export(model, path, [TensorSpec("x", [b, t, 8])], [TensorSpec("y", [b, t, 8])], exporter="torchscript")
    g = torch.Generator().manual_seed(2)
    _matches(onnx.load(path), model, lambda B, T: (torch.randn(B, T, 8, generator=g),), [(1, 16), (3, 5), (2, 13)])


# --- 3. a log2(T) parallel scan ---------------------------------------------------------------------------

@dynamo_only
def test_log2_scan_is_refused_at_its_line_without_the_strict_retry(monkeypatch):
    """``2 ** ceil(log2(T))`` is refused at its line by the non-strict capture; torch.onnx's strict retry,
    which re-traced such a scan for minutes (mambapy's pscan), is not run."""
    strict_calls = []
    export = torch.export.export
    monkeypatch.setattr(torch.export, "export",
                        lambda *a, **k: strict_calls.append(k.get("strict")) or export(*a, **k))
    t = torch.export.Dim("t", min=8)  # no maximum declared (with one, it exports: below)
    with onnx_compat.patched(), pytest.raises(UnsupportedPattern,
                                              match=r"pattern_models_round3f\.py:\d+: a math function takes"):
        torch.onnx.export(HalvingScan(), (torch.rand(2, 37, 4), torch.randn(2, 37, 4)), dynamo=True,
                          dynamic_shapes=({1: t}, {1: t}))
    assert strict_calls == [False], f"capture attempts (strict=): {strict_calls}"


@dynamo_only
def test_a_log2_scan_with_a_declared_maximum_exports_at_one_length():
    """mambapy's pscan form with the length declared up to 60 (a named ``Dim`` with ``max``, torch.onnx's own
    call): ``math.log2(T)`` is taken one past the maximum, the scan runs over 64 padded steps in 6 levels, and
    the causal result cut back to T is eager's at new lengths, B=1 first."""
    b, t = torch.export.Dim("b"), torch.export.Dim("t", min=2, max=60)
    with onnx_compat.patched():
        proto = torch.onnx.export(HalvingScan(), (torch.rand(2, 37, 4), torch.randn(2, 37, 4)), dynamo=True,
                                  dynamic_shapes=({0: b, 1: t}, {0: b, 1: t})).model_proto
    _matches(proto, HalvingScan(), lambda B, T: (torch.rand(B, T, 4), torch.randn(B, T, 4)),
             [(1, 23), (3, 60), (2, 9)])


# --- 4. complex linear algebra ----------------------------------------------------------------------------

def _waves(B, T, seed):
    return (torch.randn(B, T, generator=torch.Generator().manual_seed(seed)),)


_STFT = "STFT does not currently support complex types"
# nara-wpe's forms: a complex solve or inverse per bin, and its framing (the library picked by the class module,
# ndimension(), as_strided at the strides read with stride()); vanilla, TorchScript fails at the complex STFT and
# dynamo translating the complex tensors it captured
COMPLEX_SOLVES = [PatchCase(name, build, _waves, {0: {0: "batch", 1: "time"}}, sizes=((1, 300), (3, 517), (2, 900)),
                            example=(2, 400), atol=1e-4, rtol=1e-3, vanilla={"torchscript": _STFT, "dynamo": "Failed to convert the exported program"})
                  for name, build in (("complex_solve", ComplexSolveFilter),
                                      ("complex_inverse", lambda: ComplexSolveFilter(solver="inv")),
                                      ("strided_prediction", StridedPrediction))]
# the inverse is the solve with the identity on the right (one pair form): its dynamo export (6 s) adds nothing
COMPLEX_SOLVES[1] = dataclasses.replace(COMPLEX_SOLVES[1], exporters=("torchscript",))
test_complex_solve_exports_as_the_real_system, test_vanilla_complex_solve_fails_as_recorded = \
    patch_case_tests(COMPLEX_SOLVES)


def _complex_export(tmp_path, model):
    b, t = Dim("b", min=1, example=2), Dim("t", min=256, example=400)
    with pytest.raises(ExportError) as info:
        onnx_compat.export(model, str(tmp_path / "c.onnx"), [TensorSpec("wave", [b, t])],
                           [TensorSpec("out", [b, t])], exporter="torchscript")
    return str(info.value)


def test_complex_linear_algebra_without_a_pair_form_is_refused_naming_its_line(tmp_path):
    said = _complex_export(tmp_path, ComplexSolveFilter(solver="det"))
    assert "SpectralError" in said
    assert "pattern_models_round3f.py:" in said and "torch linalg_det of a complex tensor: complex linear " \
        "algebra is missing" in said and "[[Re A, -Im A], [Im A, Re A]]" in said


def test_a_complex_solve_of_an_order_past_the_unrolled_one_is_refused(tmp_path):
    """Order 33: the real system would be 66 columns, past ``linalg.MAX_ORDER``."""
    said = _complex_export(tmp_path, ComplexSolveFilter(taps=33))
    assert "torch linalg_solve of a complex tensor: its order is dynamic or above 32" in said


def test_a_complex_call_before_the_linear_algebra_says_it_is_further_on(tmp_path):
    """The first complex call without a pair form (``torch.sgn``) is named at its line, and the determinant
    further on in the same function is named too (a solve, which exports, is not)."""
    said = _complex_export(tmp_path, ComplexSolveFilter(solver="det", sign_first=True))
    assert "torch sgn" in said and "Further on, " in said and "(torch.linalg.det)" in said
    assert "(torch.linalg.solve)" not in said and "(torch.linalg.inv)" not in said
    assert ComplexSolveFilter(solver="det", sign_first=True)(torch.randn(1, 300)).shape == (1, 300)
