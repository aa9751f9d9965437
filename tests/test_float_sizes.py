"""Python's ``float()`` of a traced size stays in the graph (issue #47, round three: kraken's VGSL lengths rescaled
by ``float(initial_len) / o.shape[3]``, ``patches/size_floats.py``). A small line recogniser of the same structure
(``pattern_models_round3d.py``) is exported under ``patched()`` and compared with the unpatched eager model at
widths 23, 50 and 9 (B=1 first; the example is B=2, width 37); the plain export's failure is asserted where this
torch has it. One dynamo export of the model (~5 s) and one refused early; the rest is TorchScript."""
import numpy as np
import pytest
import torch

import onnx_compat
from onnx_compat.patches import size_floats
from onnx_compat.testing import assert_matches_eager, bare_onnx, patch_case_tests, session_of

from helpers import pattern_cases
from pattern_models_round3d import FloatKinds, UnreachedRatio, WidthRatioLengths

SIZES = [(1, 23), (3, 50), (2, 9)]
_AXES = {0: {0: "b", 3: "w"}, 1: {0: "b"}}


def _line(B, W, g):
    """A text line [B, 1, 8, W] and its lengths in columns, the longest filling W."""
    lengths = torch.randint(1, W + 1, (B,), generator=g)
    lengths[0] = W
    return torch.randn(B, 1, 8, W, generator=g), lengths


# plain TorchScript bakes the example's ratio (the masked frames or the lengths differ); plain dynamo specialises
# the width ("Got invalid dimensions for input" at width 23)
FLOAT_CASES = pattern_cases({
    "float_width_ratio": (WidthRatioLengths, _line, _AXES, ("torchscript", "dynamo"),
                          {"torchscript": "mismatch", "dynamo": "Got invalid dimensions for input"}),
    "float_width_ratio_kraken": (lambda: WidthRatioLengths("kraken"), _line, _AXES, ("torchscript",),
                                 {"torchscript": "mismatch"}),
    "float_of_derived_width": (lambda: WidthRatioLengths("derived"), _line, _AXES, ("torchscript",),
                               {"torchscript": "mismatch"}),
}, SIZES)
test_float_export_matches_eager, test_vanilla_float_fails_as_recorded = patch_case_tests(FLOAT_CASES)


@pytest.mark.parametrize("case", FLOAT_CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    case.assert_eager_untouched()


def test_only_a_traced_size_becomes_a_tensor_and_the_product_keeps_eagers_dtype():
    """float() of a traced size and of an integer size computed from one stay in the graph; of a value that is no
    size, of a number and of a string it is Python's float. ``arange(T) * (float(T) / B)`` is float32 in ONNX
    Runtime as in eager, and right at shapes other than the example's."""
    seen = []
    model = FloatKinds(seen)
    with onnx_compat.patched():
        proto = bare_onnx(model, (torch.randn(2, 7),), "torchscript", {0: {0: "b", 1: "t"}})
    assert seen == [torch.Tensor, torch.Tensor, float, float, float]
    session = session_of(proto)
    assert_matches_eager(session, model, [({"b": b, "t": t}, (torch.randn(b, t),)) for b, t in ((1, 5), (3, 12))],
                         atol=1e-5, rtol=1e-5, name="FloatKinds")
    out = session.run(None, {"x0": np.ones((3, 4), np.float32)})[0]
    assert out.dtype == np.float32


def test_float_outside_an_export_is_pythons():
    assert size_floats.float_of(3) == 3.0 and type(size_floats.float_of(torch.tensor(3))) is float
    assert size_floats.float_of() == 0.0 and size_floats.float_of("1e3") == 1000.0


def test_a_float_of_a_size_the_redirection_does_not_reach_is_refused_naming_the_line():
    """The dynamo guard float(SymInt) adds through SymInt.__index__ specialises the width and names no line."""
    from onnx_compat.errors import UnsupportedPattern
    with onnx_compat.patched(), pytest.raises(UnsupportedPattern, match=r"pattern_models_round3d\.py:\d+: float\(\) "
                                                                          r"of the dynamic size"):
        bare_onnx(UnreachedRatio(), (torch.randn(2, 7),), "dynamo", {0: {0: "b", 1: "t"}})
