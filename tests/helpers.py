"""Export with either exporter and compare ONNX Runtime with eager PyTorch."""
from __future__ import annotations

import contextlib

import onnxruntime as ort
import pytest
import torch

import onnx_compat
from onnx_compat import testing, versions
from onnx_compat.pipeline.capture import HAS_DYNAMO

EXPORTERS = list(testing.EXPORTERS)
# ONNX Runtime's basic optimiser fuses a Pad into the Conv after it from 1.17 on (1.16.3 keeps the Pad)
PAD_FUSION = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 17)


export = testing.bare_onnx  # the tests' short name for it


def run(proto, *inputs):
    return testing.runtime_outputs(testing.session_of(proto), inputs)


def assert_matches(proto, model, *inputs, atol=1e-4, rtol=1e-3):
    """ORT output equals eager output of ``model`` (run outside any patch), named by the inputs' shapes."""
    inputs = tuple(torch.as_tensor(x) for x in inputs)
    sizes = {f"x{i}": "x".join(map(str, x.shape)) for i, x in enumerate(inputs)}
    testing.assert_matches_eager(proto, model, [(sizes, inputs)], atol=atol, rtol=rtol,
                                 name=type(model).__name__)


def auto_pads(proto):
    """Conv nodes that still use the deprecated auto_pad attribute."""
    return [n.name for n in proto.graph.node if n.op_type == "Conv"
            and any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in n.attribute)]


def vanilla_string_padding_failure(model, args, dynamic):
    """How an unpatched TorchScript export of string padding fails on this torch.

    torch 2.0 refuses to export ``aten::_convolution_mode``; newer torch writes
    ``auto_pad``, which ONNX Runtime cannot run with dilation. Returns the
    proto (newer torch) or None (export refused), asserting one of the two.
    """
    try:
        proto = export(model, args, "torchscript", dynamic)
    except Exception as exc:  # torch.onnx.errors.UnsupportedOperatorError on torch 2.0
        assert "_convolution_mode" in str(exc), exc
        return None
    assert auto_pads(proto)
    return proto


# for tests that only make sense with torch's dynamo exporter
needs_dynamo = pytest.mark.skipif(not HAS_DYNAMO, reason=versions.NO_DYNAMO)


def vanilla_failure(check, expected):
    """``onnx_compat.testing.assert_fails_as_recorded``: the unpatched export fails, and how."""
    testing.assert_fails_as_recorded(check, expected)



class PatternCases:
    """Small models of export patterns: ``cases`` maps a name to (build, inputs(B, T, generator), dynamic
    axes, exporters, failure per exporter without the patch). Exported at (2, 37); checked against the
    eager model at ``sizes`` (B=1 first, other lengths), naming the size that failed."""

    def __init__(self, cases, sizes=((1, 23), (3, 50), (2, 9))):
        self.cases, self.sizes = cases, list(sizes)

    def build(self, name):
        torch.manual_seed(sum(map(ord, name)))
        return self.cases[name][0]().eval()

    def inputs(self, name, B, T, seed):
        return self.cases[name][1](B, T, torch.Generator().manual_seed(seed))

    def export(self, model, name, exporter):
        with torch.no_grad():
            return export(model, self.inputs(name, 2, 37, 0), exporter, self.cases[name][2])

    def check(self, proto, model, name):
        import numpy as np
        for seed, (B, T) in enumerate(self.sizes, start=1):
            args = self.inputs(name, B, T, seed)
            with torch.no_grad():
                expected = model(*args).numpy()
            got = run(proto, *[a.numpy() for a in args])[0]
            where = f"{name} at B={B}, T={T}"
            assert got.shape == expected.shape, f"{where}: shape {got.shape}, eager {expected.shape}"
            assert np.std(expected) > 1e-3, f"{where}: degenerate reference output"
            np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3, err_msg=where)

    def patched_matches_eager(self, name, exporter):
        """Exported under ``patched()``, ONNX Runtime matches the unpatched model at the new sizes."""
        if exporter not in EXPORTERS:
            pytest.skip("the dynamo exporter is used from torch 2.13 on")
        model = self.build(name)
        with onnx_compat.patched():
            proto = self.export(model, name, exporter)
        self.check(proto, model, name)

    def fails_as_recorded(self, name, exporter, context=None):
        """Without the patch (``context``: none, or ``patched(exclude=...)``) it fails as recorded on 2.13."""
        if exporter not in EXPORTERS or not torch.__version__.startswith("2.13"):
            pytest.skip(f"recorded on torch 2.13 (this is {torch.__version__})")
        model = self.build(name)
        with context or contextlib.nullcontext():
            vanilla_failure(lambda: self.check(self.export(model, name, exporter), model, name),
                            self.cases[name][4][exporter])

    def eager_untouched(self, name):
        """Inside ``patched()`` but not exporting, the model computes exactly what it computes outside."""
        model = self.build(name)
        args = self.inputs(name, 3, 20, 5)
        with torch.no_grad():
            expected = model(*args)
            with onnx_compat.patched():
                got = model(*args)
        assert torch.equal(got, expected)
