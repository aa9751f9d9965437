"""Sizes computed by Python code (issue: sizes that stay dynamic). The dynamo exporter traces them
symbolically; the TorchScript exporter freezes them, and the pipeline then names the line that did."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import onnx_compat
from onnx_compat import Dim, ExportError, TensorSpec


from helpers import EXPORTERS, line_of, needs_dynamo


class CeilFrames(nn.Module):
    """``math.ceil(T / 4)`` frames; pad amount computed in Python (SEANet-style)."""

    def forward(self, data, lengths):
        frames = math.ceil(data.shape[1] / 4)  # baked by TorchScript
        x = F.pad(data, (0, 0, 0, frames * 4 - data.shape[1]))
        return x.reshape(x.shape[0], frames, 4 * x.shape[2]), (lengths + 3) // 4


class MaxLengthMask(nn.Module):
    """torchaudio Conformer's padding mask: ``torch.arange(int(lengths.max()))``."""

    def forward(self, data, lengths):
        longest = int(lengths.max())  # baked by TorchScript
        mask = torch.arange(longest, device=data.device).expand(lengths.shape[0], longest) >= lengths[:, None]
        return data[:, :longest].masked_fill(mask[..., None], 0.0), lengths


CASES = {
    "ceil_frames": (CeilFrames, 12, "frames", "frames = math.ceil("),
    "max_length_mask": (MaxLengthMask, 3, "time", "longest = int("),
}


def _specs(name):
    _, width, out_time, _ = CASES[name]
    batch, time = Dim("batch"), Dim("time")
    return ([TensorSpec("data", [batch, time, 3], lengths=[1])],
            [TensorSpec("output", [batch, time if out_time == "time" else Dim(out_time), width], lengths=[1])])


@needs_dynamo
@pytest.mark.parametrize("name", list(CASES))
def test_auto_keeps_python_size_arithmetic_dynamic(name, tmp_path):
    report = onnx_compat.export(CASES[name][0](), str(tmp_path / "m.onnx"), *_specs(name), exporter="auto")
    # TorchScript first, and it keeps both: math.ceil stays in its graph (size_rounding) and int(lengths.max())
    # is the padded dim (padded_lengths_int). CeilFrames' graph is mostly shape bookkeeping, so auto times
    # dynamo's too
    first = "torchscript"
    assert next(a.exporter for a in report.attempts if a.ok) == first, report.summary()
    assert report.exporter == (report.speed["chosen"] if report.speed else first), report.summary()
    assert all(c["ok"] for c in report.verification), report.summary()
    assert {c["sizes"]["time"] for c in report.verification} >= {23}


def test_torchscript_keeps_ceil_of_a_size_in_the_graph(tmp_path):
    """``size_rounding``: ``math.ceil`` of a traced size stays symbolic under TorchScript."""
    report = onnx_compat.export(CeilFrames(), str(tmp_path / "m.onnx"), *_specs("ceil_frames"), exporter="torchscript")
    assert all(c["ok"] for c in report.verification) and {c["sizes"]["time"] for c in report.verification} >= {23}


class ShortestLengthCrop(nn.Module):
    """A size read from the lengths' values that is not their padded maximum: the shortest sequence's length."""

    def forward(self, data, lengths):
        shortest = int(lengths.min())  # baked by TorchScript
        return data[:, :shortest] * 2.0


def test_torchscript_names_the_line_that_froze_a_size(tmp_path):
    batch, time = Dim("batch"), Dim("time")
    specs = ([TensorSpec("data", [batch, time, 3], lengths=[1])], [TensorSpec("output", [batch, Dim("kept"), 3])])
    line = line_of(ShortestLengthCrop, "shortest = int(")
    with pytest.raises(ExportError, match=rf"frozen into the graph by Python code at .*test_sizes.py:{line}"):
        onnx_compat.export(ShortestLengthCrop(), str(tmp_path / "m.onnx"), *specs, exporter="torchscript")
    assert not (tmp_path / "m.onnx").exists()


def test_torchscript_keeps_int_of_the_longest_length_the_padded_dim(tmp_path):
    """``padded_lengths_int``: ``int(lengths.max())`` of a declared lengths input is the traced padded dim."""
    report = onnx_compat.export(MaxLengthMask(), str(tmp_path / "m.onnx"), *_specs("max_length_mask"),
                                exporter="torchscript")
    assert report.strategy == "torchscript" and all(c["ok"] for c in report.verification), report.summary()
    assert {c["sizes"]["time"] for c in report.verification} >= {23}


class SegmentLoop(nn.Module):
    """torchaudio's Emformer builds its right-context blocks and attention mask in Python loops over
    ``math.ceil(T / segment_length)`` segments: the segment count is a loop count, not a value."""

    def forward(self, data):
        segments = math.ceil(data.shape[1] / 4)
        blocks = [data[:, s * 4:(s + 1) * 4].mean(1, keepdim=True) for s in range(segments)]  # the loop
        return torch.cat(blocks, 1)


def test_a_python_loop_over_segments_is_refused_by_both_exporters(tmp_path):
    """No exporter keeps a Python loop count dynamic: one error, each attempt in it, no file."""
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time", min=8), 3])]
    outputs = [TensorSpec("output", [batch, Dim("segments"), 3])]
    with pytest.raises(ExportError) as failed:
        onnx_compat.export(SegmentLoop(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="auto")
    message = str(failed.value)
    assert "torchscript:" in message and "'segments'" in message, message
    if "dynamo" in EXPORTERS:  # dynamo_loops names the loop's own line
        assert "dynamo:" in message and f"test_sizes.py:{line_of(SegmentLoop, '# the loop')}" in message, message
    assert not (tmp_path / "m.onnx").exists()


class IntCeilFrames(nn.Module):
    """``int(math.ceil(T / 4))`` (HDemucs, Demucs' valid length): ``int()`` of a size is a Python number under
    both exporters; dynamo's dynamic hints turn its guard into an upper bound on T instead of an error."""

    def forward(self, data, lengths):
        frames = int(math.ceil(data.shape[1] / 4))
        x = data.new_zeros(data.shape[0], frames * 4, data.shape[2])
        x[:, :data.shape[1]] = data  # dynamo: T <= 4 * frames of the example, a bound on T
        return x.reshape(x.shape[0], frames, 4 * x.shape[2]), (lengths + 3) // 4


@needs_dynamo
def test_a_bound_dynamo_puts_at_the_example_is_found_and_named():
    """With dynamic hints, torch.export turns the guard on ``int(math.ceil(T / 4))`` into ``T <= 40`` (the
    example is 37) and exports a graph that holds 10 frames: the capture reads the bound back and refuses
    (``DimSpecialized`` with a ``NarrowedDim``) instead of exporting a graph wrong at other lengths."""
    from onnx_compat.errors import NarrowedDim
    from onnx_compat.pipeline import dims
    inputs, _ = _specs("ceil_frames")
    args = (torch.randn(2, 37, 3), torch.tensor([37, 20]))
    hint = torch.export.Dim.DYNAMIC
    program = torch.export.export(IntCeilFrames(), args, dynamic_shapes=({0: hint, 1: hint}, {0: hint}), strict=False)
    found = dims.narrowed_dims(program, ["data", "data:size1"], dims.axes_of(inputs), args)
    assert found == [NarrowedDim("data", 1, "time", 40, None)], found
    assert "requested dynamic at any size but the traced model holds only up to 40" in str(found[0])


def test_a_bound_far_from_the_example_is_the_models_own(tmp_path):
    """A position table caps T at 64 (the example is 17): a real limit of the model, not a baked size."""
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(64, 3))

        def forward(self, data):
            return data + self.table[:data.shape[1]]

    inputs = [TensorSpec("data", [Dim("batch"), Dim("time", max=64), 3])]
    for exporter in EXPORTERS:
        report = onnx_compat.export(Positions(), str(tmp_path / f"{exporter}.onnx"), inputs,
                                    [TensorSpec("output", [Dim("batch"), Dim("time"), 3])], exporter=exporter,
                                    sizes={"time": 17})
        assert all(c["ok"] for c in report.verification), report.summary()
