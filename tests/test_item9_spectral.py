"""Issue #47 item 9, second half: the Demucs family's size code (demucs v2, torchaudio's HDemucs, HTDemucs) and
DeepFilterNet3.

A centre trim ``x[..., d // 2:-(d - d // 2)]`` behind ``if d:`` (demucs/utils.py:53) is empty in both exporters'
graphs at the lengths where ``d`` is 0 (``patches/slice_from_end.py``): checked against the unpatched eager
model at a length with no trim (B=1), a longer and a shorter one; without the patch the TorchScript graph's
output is empty at T=36. A size carried through ~20 steps of size arithmetic (demucs' ``valid_length``) is still
known as a traced size, so ``is_tensor``/``int()``/``isinstance`` of it act as in eager (``size_math.py``).
DeepFilterNet3's deep filter, an ``einsum`` of two complex tensors (df/multiframe.py:136), raised ``SpectralError``;
it is the four einsums of their parts (``_complex.py``), checked under both exporters at T=23 (B=1), 50 and 2.
"""
import io
import math

import torch

import onnx_compat
from onnx_compat.patches import size_math
from onnx_compat.testing import PatchCase, patch_case_tests

from pattern_models_item9 import CenterTrimmed, DeepFilter, ValidLength


def _wave(B, T, seed):
    return (torch.randn(B, 1, T, generator=torch.Generator().manual_seed(seed)),)


CASES = [PatchCase("center_trimmed", CenterTrimmed, _wave, {0: {0: "batch", 2: "time"}},
                   sizes=((1, 36), (3, 50), (2, 9)),
                   vanilla={"torchscript": "gives shape (1, 2, 0), eager (1, 2, 36)"},
                   unpatched=lambda: onnx_compat.patched(exclude=["slice_stop_from_end"])),
         PatchCase("deep_filter", DeepFilter, lambda B, T, seed: (torch.randn(
                       B, T, 12, 2, generator=torch.Generator().manual_seed(seed)),), {0: {0: "batch", 1: "time"}},
                   sizes=((1, 23), (3, 50), (2, 2)), vanilla={"torchscript": "view_as_complex"}),
         # T=52 and 100 take no trim; the example 77 is padded to 84 and trimmed back
         PatchCase("valid_length", ValidLength, _wave, {0: {0: "batch", 2: "time"}},
                   sizes=((1, 52), (3, 101), (2, 40)), example=(2, 77),
                   vanilla={"torchscript": "Dimension specified as -1"})]
test_item9_patterns_export, test_item9_unpatched_fails_as_recorded = patch_case_tests(CASES)


class _LongSizeArithmetic(torch.nn.Module):
    """demucs v2's ``valid_length`` form: a size through ceil, max and products, ~20 traced steps."""

    def forward(self, x):
        length = x.shape[-1]
        for _ in range(2):
            length = math.ceil((length - 8) / 4) + 1  # size_rounding keeps it a traced size
        for _ in range(2):
            length = (length - 1) * 4 + 8
        seen.append((torch.is_tensor(length), size_math.int_of_size(length) is length,
                     size_math.isinstance_of(length, torch.Tensor), size_math.isinstance_of(length, (int, float))))
        return x.new_zeros(x.shape[0], length)


seen = []


def test_a_long_size_computation_is_still_a_traced_size():
    """The graph's output follows the length (right at T=100, exported at 37), and while tracing the computed
    length answers as an int would: not a tensor (``is_tensor``, ``isinstance``), kept by ``int()``."""
    seen.clear()
    buf = io.BytesIO()
    with onnx_compat.patched():
        torch.onnx.export(_LongSizeArithmetic(), (torch.randn(2, 37),), buf, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "b", 1: "t"}})
    assert seen and set(seen) == {(False, True, False, True)}
    import onnxruntime as ort
    session = ort.InferenceSession(buf.getvalue())
    for T in (9, 101):
        got = session.run(None, {"x": torch.randn(1, T).numpy()})[0]
        assert got.shape == tuple(_LongSizeArithmetic()(torch.randn(1, T)).shape), f"at T={T}"
