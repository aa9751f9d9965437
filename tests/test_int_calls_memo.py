"""The int()/len()/max()/min() redirection keeps its rewritten code objects across exports (issue #50): a
function changed between two exports must be exported as it is now, never from the memo."""
import gc

import torch
import torch.nn as nn

import onnx_compat
from onnx_compat.patches import int_calls
from onnx_compat.testing import assert_matches_eager

from helpers import export


def _scaled(x):
    return x * int(2)  # a called int: its code object is rewritten (int_of) while the export traces


class Scaled(nn.Module):
    def forward(self, x):
        return _scaled(x) + 1.0


def _exported_and_checked(model):
    """TorchScript export under the patches, ONNX Runtime against the unpatched eager model at two new shapes."""
    with onnx_compat.patched():
        proto = export(model, (torch.randn(2, 7, 4),), "torchscript", {0: {0: "b", 1: "t"}})
    cases = [({"b": b, "t": t}, (torch.randn(b, t, 4),)) for b, t in ((1, 5), (3, 11))]
    assert_matches_eager(proto, model, cases, atol=1e-6, rtol=1e-6, name="Scaled")
    return proto


def test_a_function_given_new_code_between_two_exports_is_exported_as_it_is_now():
    global _scaled
    first_code = _scaled.__code__
    _exported_and_checked(Scaled())
    assert int_calls._rewritten(first_code) is int_calls._rewritten(first_code)  # memoised, not rebuilt
    original = _scaled
    try:
        _scaled.__code__ = (lambda x: x * int(3)).__code__  # the same function object, new code
        _exported_and_checked(Scaled())  # compares with the eager x * 3 + 1: a stale x * 2 would fail
        _scaled = lambda x: x - int(5)  # noqa: E731 - the global rebound to a new function
        _exported_and_checked(Scaled())
    finally:
        original.__code__ = first_code
        _scaled = original
    assert _scaled.__code__ is first_code


def test_the_memo_lets_go_of_code_objects_that_are_gone():
    namespace = {}
    exec("def helper(x):\n    return x * int(4)\n", namespace)
    code = namespace["helper"].__code__
    rewritten = int_calls._rewritten(code)
    assert rewritten is not code and int_calls.NAME in rewritten.co_names
    held = len(int_calls._MEMO._entries)
    del namespace, code, rewritten
    gc.collect()
    assert len(int_calls._MEMO._entries) < held
