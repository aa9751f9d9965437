"""What stays unsupported is refused in one error that names the model's line, with either exporter.

Three forms met on the sweep (round two) that no patch can turn into a right graph: a Python loop over
fixed-size chunks of a dynamic dim, a computation that leaves torch for numpy (torchcrepe's Viterbi
decode), and a network kept outside the model (torchcrepe's in a module global). Each test builds its
own small model here; the numbers of a wrong graph are checked too, so a refusal is never the only proof.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ExportError, UnsupportedPattern

from helpers import needs_dynamo, run


def _line(fn, offset: int) -> str:
    return f"test_refusals.py:{fn.__code__.co_firstlineno + offset}"


class FixedChunks(nn.Module):
    """Fixed-size chunks of the whole time dim, each through f, then joined again."""

    def forward(self, x):
        out = []
        for i in range(0, x.size(1), 4):
            out.append(torch.tanh(x[:, i:i + 4]))
        return torch.cat(out, 1)


def _specs():
    b, t = Dim("batch"), Dim("time")
    return [TensorSpec("x", [b, t, 4])], [TensorSpec("y", [b, t, 4])]


def test_vanilla_torchscript_unrolls_a_chunk_loop_without_a_word(tmp_path, recwarn):
    """The recorded failure: the plain exporter writes the example's count of chunks, and says nothing
    (``range`` takes the traced size through ``__index__``, which gives no TracerWarning)."""
    path = str(tmp_path / "plain.onnx")
    torch.onnx.export(FixedChunks(), (torch.randn(2, 13, 4),), path, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "b", 1: "t"}, "y": {0: "b", 1: "t"}})
    x = torch.randn(1, 21, 4)
    got = run(path, x.numpy())[0]
    assert got.shape[1] != 21, "the plain export kept the loop dynamic: the pattern test below is moot"
    assert not [w for w in recwarn if issubclass(w.category, torch.jit.TracerWarning)]


def test_a_chunk_loop_is_named_at_its_line_under_torchscript(tmp_path):
    x_in, y_out = _specs()
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(FixedChunks(), str(tmp_path / "m.onnx"), x_in, y_out, exporter="torchscript")
    text = str(raised.value)
    assert _line(FixedChunks.forward, 2) in text and "frozen into the graph" in text, text[-900:]
    assert not (tmp_path / "m.onnx").exists()


@needs_dynamo
def test_a_chunk_loop_refusal_comes_first_under_dynamo(tmp_path):
    """The loop refusal is deliberate (``UnsupportedPattern``): it is the dynamo error the user reads, not
    listed after the plain export's "dim was specialized" as if a patch had broken."""
    x_in, y_out = _specs()
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(FixedChunks(), str(tmp_path / "m.onnx"), x_in, y_out, exporter="dynamo")
    head = str(raised.value).split("also tried")[0]
    assert "UnsupportedPattern" in head and _line(FixedChunks.forward, 2) in head, str(raised.value)[-900:]
    assert "failed in a patch" not in str(raised.value)


class PeakPicker(nn.Module):
    """A network, then numpy for what follows, frame by frame (a Viterbi decode)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x):
        scores = self.proj(x).log_softmax(-1).detach().numpy()
        for t in range(1, scores.shape[1]):  # a running best path, frame by frame
            scores[:, t] += scores[:, t - 1].max(-1, keepdims=True)
        return torch.from_numpy(np.argmax(scores, axis=-1))


@needs_dynamo
def test_numpy_of_a_computed_tensor_names_its_line_under_dynamo(tmp_path):
    b, t = Dim("batch"), Dim("time")
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(PeakPicker(), str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 4])],
                           [TensorSpec("best", [b, t], dtype=torch.int64)], exporter="dynamo")
    text = str(raised.value)
    assert _line(PeakPicker.forward, 1) in text and "leaves torch" in text, text[-900:]


def test_numpy_of_a_computed_tensor_is_its_own_error_while_dynamo_traces():
    """The refusal itself, below the pipeline: ``UnsupportedPattern`` (a ``NotImplementedError`` too)."""
    assert issubclass(UnsupportedPattern, NotImplementedError)
    assert issubclass(UnsupportedPattern, onnx_compat.OnnxCompatError)


_OUTSIDE = nn.Linear(4, 4)  # a network kept in a module global, loaded once (torchcrepe.infer.model)


class UsesAGlobalNetwork(nn.Module):
    def forward(self, x):
        return torch.tanh(_OUTSIDE(x))


def test_weights_outside_the_model_are_named_under_torchscript(tmp_path):
    x_in, y_out = _specs()
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(UsesAGlobalNetwork(), str(tmp_path / "m.onnx"), x_in, y_out,
                           exporter="torchscript")
    text = str(raised.value)
    assert "module kept outside the model" in text and _line(UsesAGlobalNetwork.forward, 1) in text, text[-900:]
    assert _OUTSIDE.weight.requires_grad  # the user's network as it was
