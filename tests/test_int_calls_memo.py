"""The int()/len()/max()/min() redirection keeps its rewritten code objects and its walk of the model's functions
across exports (issue #50): a function or class changed between two exports must be exported as it is now,
never from what was kept."""
import gc

import torch
import torch.nn as nn

import onnx_compat
from onnx_compat.patches import int_calls, reached_functions
from onnx_compat.testing import assert_matches_eager

from helpers import export


def _scaled(x):
    return x * (len(x) + 1)  # a called len: rewritten to len_of while the export traces, else the batch is baked


class Scaled(nn.Module):
    def forward(self, x):
        return _scaled(x) + self.shift(x)

    @staticmethod
    def shift(x):
        return 1.0  # no call to rewrite


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
        _scaled.__code__ = (lambda x: x * (len(x) + 2)).__code__  # the same function object, new code
        _exported_and_checked(Scaled())  # compares with the eager x * (B + 2) + 1: stale code gives x * (B + 1)
        _scaled = lambda x: x - len(x)  # noqa: E731 - the global rebound: unless walked to, its len() is baked
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
    held = len(int_calls._REWRITES)
    del namespace, code, rewritten
    gc.collect()
    assert len(int_calls._REWRITES) < held


def test_a_method_replaced_between_two_exports_is_walked_to_and_exported_as_it_is_now(monkeypatch):
    walks = []
    monkeypatch.setattr(reached_functions, "_walk", lambda *a, _walk=reached_functions._walk: walks.append(1) or
                        _walk(*a))
    _exported_and_checked(Scaled())
    _exported_and_checked(Scaled())
    assert len(walks) == 1  # nothing changed: the kept walk served the second export
    monkeypatch.setattr(Scaled, "shift", staticmethod(lambda x: x * len(x)))  # the class's namespace changed
    _exported_and_checked(Scaled())  # the kept walk would miss the new method: its len() baked at B=2
    assert len(walks) == 2
    found = reached_functions.functions_of(Scaled())
    assert Scaled.shift in found and _scaled in found
