"""Export with either exporter and compare ONNX Runtime with eager PyTorch."""
from __future__ import annotations

import contextlib
import inspect

import onnxruntime as ort
import pytest
import torch

from onnx_compat import testing, versions
from onnx_compat.pipeline.capture import HAS_DYNAMO

EXPORTERS = list(testing.EXPORTERS)
# ONNX Runtime's basic optimiser fuses a Pad into the Conv after it from 1.17 on (1.16.3 keeps the Pad)
PAD_FUSION = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 17)


export = testing.bare_onnx  # the tests' short name for it


def line_of(obj, text):
    """The number of the first line of ``obj``'s source (a class or function) that holds ``text``: what an error
    naming the model's line must name."""
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, line in enumerate(lines) if text in line)


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


def pattern_cases(table, sizes, unpatched=None):
    """A table of export patterns as ``PatchCase`` rows (the one case harness). ``table`` maps a name to
    (build, inputs(B, T, generator), dynamic axes, exporters, how the export fails without the patch per
    exporter); ``unpatched(name)``: the context that export runs in when it is not plain vanilla."""
    def seeded(inputs):
        return lambda B, T, seed: inputs(B, T, torch.Generator().manual_seed(seed))

    return [testing.PatchCase(name, build, seeded(inputs), dynamic, sizes=tuple(sizes), exporters=tuple(exporters),
                              vanilla=vanilla, atol=1e-4, rtol=1e-3,
                              unpatched=(unpatched(name) if unpatched else None) or contextlib.nullcontext)
            for name, (build, inputs, dynamic, exporters, vanilla) in table.items()]
