"""Export with either exporter and compare ONNX Runtime with eager PyTorch."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from onnx_compat.pipeline.capture import HAS_DYNAMO
from onnx_compat.pipeline.vanilla import plain_export

EXPORTERS = ["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"]
# ONNX Runtime's basic optimiser fuses a Pad into the Conv after it from 1.17 on (1.16.3 keeps the Pad)
PAD_FUSION = tuple(int(x) for x in ort.__version__.split(".")[:2]) >= (1, 17)


def export(model, args, exporter, dynamic, names=None):
    """ONNX ModelProto of ``model`` at example ``args``: a bare ``torch.onnx.export``.

    ``dynamic`` maps each input index to ``{axis: name}``; ``names`` are the
    input names (default x0, x1, ...).
    """
    names = names or [f"x{i}" for i in range(len(args))]
    return plain_export(model, args, exporter, names, {names[i]: axes for i, axes in dynamic.items()},
                       output_names=["y"])


def run(proto, *inputs):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(x) for i, x in zip(sess.get_inputs(), inputs)}
    return sess.run(None, feeds)


def assert_matches(proto, model, *inputs, atol=1e-4, rtol=1e-3):
    """ORT output equals eager output of ``model`` (run outside any patch)."""
    with torch.no_grad():
        expected = model(*[torch.as_tensor(x) for x in inputs])
    got = run(proto, *[x.numpy() for x in inputs])[0]
    expected = expected.numpy()
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert np.std(expected) > 1e-6, "degenerate reference output"
    np.testing.assert_allclose(got, expected, atol=atol, rtol=rtol)


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


def vanilla_failure(check, expected):
    """Assert that ``check()`` (an unpatched export and its comparison with eager) fails, and how:
    ``expected`` (or one of a tuple of texts: older releases fail earlier) is in the error text,
    prefixed "mismatch: " for wrong numbers."""
    try:
        check()
    except AssertionError as exc:
        message = "mismatch: " + str(exc)
    except Exception as exc:  # export or ONNX Runtime error
        message = str(exc)
    else:
        pytest.fail("the unpatched export worked; the patch is not needed here")
    assert any(text in message for text in ((expected,) if isinstance(expected, str) else expected)), message[:500]
