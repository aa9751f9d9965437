"""Specs, names and example inputs."""
import re

import numpy as np
import pytest
import torch

import onnx_compat
from onnx_compat import Dim, SpecError, TensorSpec
from onnx_compat.spec import dim_sizes, forward_arguments, make_inputs, size_name, verification_sizes

from models import NamedArgs, named_specs, subsample_specs


def test_size_names_follow_the_convention():
    spec = TensorSpec("data", [Dim("batch"), Dim("time"), 40], lengths=[1])
    assert size_name("data", 1) == "data:size1"
    assert spec.onnx_names == ["data", "data:size1"]
    assert spec.describe()["lengths"] == {"data:size1": "int32"}


def test_example_inputs_lengths_differ_and_the_longest_is_full():
    inputs, _ = subsample_specs()
    sizes = dim_sizes(inputs)
    assert sizes["batch"] >= 2 and sizes["time"] >= 2
    feeds = make_inputs(inputs, sizes, seed=3)
    assert list(feeds) == ["data", "data:size1"]
    lengths = feeds["data:size1"]
    assert lengths.dtype == torch.int32 and lengths.shape == (sizes["batch"],)
    assert int(lengths.max()) == sizes["time"] and len(set(lengths.tolist())) > 1
    assert int(lengths.min()) >= 8  # Dim min
    again = make_inputs(inputs, sizes, seed=3)
    assert torch.equal(again["data"], feeds["data"])           # seeded


def test_example_sizes_respect_overrides_and_bounds():
    inputs = [TensorSpec("audio", [Dim("batch"), Dim("samples", min=400, max=1000)], lengths=[1])]
    assert dim_sizes(inputs)["samples"] == 800
    assert dim_sizes(inputs, {"samples": 5000})["samples"] == 1000
    with pytest.raises(ValueError, match="min"):
        Dim("t", min=0)


def test_verification_sizes_are_new_and_include_batch_one():
    inputs, _ = subsample_specs()
    example = dim_sizes(inputs)
    shapes = verification_sizes(inputs, example)
    assert len(shapes) >= 3 and shapes[0]["batch"] == 1
    assert all(s != example for s in shapes)
    assert any(s["time"] < example["time"] for s in shapes) and any(s["time"] > example["time"] for s in shapes)


def test_bad_specs_are_refused_with_their_names():
    with pytest.raises(ValueError, match="axis 1 has lengths, so it must be a Dim"):
        TensorSpec("data", [Dim("batch"), 40], lengths=[1])
    with pytest.raises(ValueError, match="not a non-batch axis"):
        TensorSpec("data", [Dim("batch"), Dim("t")], lengths=[0])
    with pytest.raises(ValueError, match="lengths_dtype"):
        TensorSpec("data", [Dim("batch"), Dim("t")], lengths=[1], lengths_dtype=torch.float32)


def test_forward_arguments_checks_names():
    model = NamedArgs()
    spec = TensorSpec("data", [Dim("batch"), Dim("time"), 6], lengths=[1], arg="feats", length_args={1: "feature_lengths"})
    with pytest.raises(ValueError, match="'feats'.*does not have"):
        forward_arguments(model, [spec])
    ok = TensorSpec("data", [Dim("batch"), Dim("time"), 6], lengths=[1], arg="features", length_args={1: "feature_lengths"})
    assert forward_arguments(model, [ok]) == [("data", "features"), ("data:size1", "feature_lengths")]
    too_many = [TensorSpec("a", [Dim("batch"), 2]), TensorSpec("b", [Dim("batch"), 2]), TensorSpec("c", [Dim("batch"), 2])]
    with pytest.raises(ValueError, match="3 inputs"):
        forward_arguments(model, too_many)


def test_dims_that_are_multiples_round_up_everywhere():
    samples = Dim("samples", min=200, max=1000, multiple=10)
    inputs = [TensorSpec("data", [Dim("batch"), samples], lengths=[1])]
    example = dim_sizes(inputs, {"samples": 403})
    assert example["samples"] == 410
    checks = verification_sizes(inputs, example)
    assert all(c["samples"] % 10 == 0 and 200 <= c["samples"] <= 1000 for c in checks)
    assert {c["samples"] for c in checks} - {example["samples"]}
    assert dim_sizes(inputs, {"samples": 5000})["samples"] == 1000
    with pytest.raises(ValueError, match="multiple"):
        Dim("samples", multiple=0)
    with pytest.raises(ValueError, match="no multiple of 10"):
        Dim("samples", min=11, max=19, multiple=10)


class SpeakerConditioned(torch.nn.Module):
    """Features plus a speaker id into an embedding table of 3 speakers (as a unit vocoder's speaker_id)."""

    def __init__(self):
        super().__init__()
        self.speakers = torch.nn.Embedding(3, 4)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, data, speaker):
        return self.proj(data) + self.speakers(speaker)[:, None, :]


def _speaker_specs(values):
    batch = Dim("batch")
    return ([TensorSpec("data", [batch, Dim("time"), 4], values=(-1.0, 1.0)),
             TensorSpec("speaker", [batch], dtype=torch.int64, values=values)],
            [TensorSpec("output", [batch, Dim("time"), 4])])


def test_declared_values_let_bounded_ids_export_and_verify(tmp_path):
    import onnx
    model = SpeakerConditioned().eval()
    # without values= the range is read from the embedding the ids index (int_ranges), and said so
    inferred = onnx_compat.export(model, str(tmp_path / "a.onnx"), *_speaker_specs(None), exporter="torchscript")
    assert all(c["ok"] for c in inferred.verification) and any("values=(0, 3)" in f for f in inferred.findings), \
        inferred.findings
    path = str(tmp_path / "b.onnx")
    report = onnx_compat.export(model, path, *_speaker_specs((0, 3)), exporter="auto")
    assert all(c["ok"] for c in report.verification) and not report.degenerate
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert '"values": [0, 3]' in meta["onnx_compat.inputs"]


def test_values_draw_inside_the_range():
    from onnx_compat.spec import make_inputs
    ids = TensorSpec("ids", [Dim("batch"), 50], dtype=torch.int32, values=(100, 103))
    wav = TensorSpec("wav", [Dim("batch"), 400], values=(-1, 1))
    feeds = make_inputs([ids, wav], {"batch": 4}, seed=3)
    assert set(feeds["ids"].unique().tolist()) == {100, 101, 102} and feeds["ids"].dtype == torch.int32
    assert -1 <= float(feeds["wav"].min()) < -0.9 and 0.9 < float(feeds["wav"].max()) <= 1


@pytest.mark.parametrize("kwargs,message", [
    (dict(values=(2, 2)), r"needs low < high"),
    (dict(values=(0.5, 3), dtype=torch.int64), r"must be ints \(the tensor is int64\)"),
    (dict(values=(0, 1), dtype=torch.bool), "does not apply to a bool tensor"),
    (dict(values=5), r"must be a \(low, high\) pair"),
], ids=["empty_range", "float_range_for_ints", "range_for_bool", "not_a_pair"])
def test_bad_values_are_one_spec_error_naming_the_input(kwargs, message):
    with pytest.raises(onnx_compat.SpecError, match="^x: .*" + message):
        TensorSpec("x", [Dim("batch")], **kwargs)


def _examples_job():
    model, inputs, outputs = NamedArgs().eval(), *named_specs()
    return model, inputs, outputs


def _named_example(batch=2, time=9, **changes):
    example = {"data": torch.randn(batch, time, 6), "data:size1": torch.tensor([time] + [time - 2] * (batch - 1),
                                                                               dtype=torch.int32)}
    example.update(changes)
    return example


def test_examples_are_exported_and_verified(tmp_path):
    model, inputs, outputs = _examples_job()
    examples = [_named_example(2, 9), _named_example(1, 31)]
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript",
                                examples=examples)
    on_examples = [c for c in report.verification if c["example"]]
    assert [c["sizes"] for c in on_examples] == [{"batch": 2, "time": 9}, {"batch": 1, "time": 31}]
    assert all(c["ok"] for c in report.verification) and len(report.verification) == 5
    assert {c["sizes"]["time"] for c in report.verification if not c["example"]} - {9}  # unseen sizes still run
    checks = onnx_compat.verify(str(tmp_path / "m.onnx"), model, inputs, outputs, examples=[_named_example(4, 12)])
    assert checks[-1].example and checks[-1].ok


@pytest.mark.parametrize("change,message", [
    (dict(drop="data:size1"), r"example 0: missing input\(s\) \['data:size1'\]"),
    (dict(extra=torch.zeros(2)), r"example 0: unknown input\(s\) \['extra'\]"),
    (dict(data=torch.randn(2, 9, 6).double()), "example 0: input 'data' is float64, declared float32"),
    (dict(data=torch.randn(2, 9)), "example 0: input 'data' has rank 2, declared 3"),
    (dict(data=torch.randn(2, 9, 5)), "example 0: input 'data' dim 2 is 5, declared static 6"),
    (dict(**{"data:size1": torch.tensor([9, 7, 7], dtype=torch.int32)}),
     r"example 0: input 'data:size1' dim 0 \('batch'\) is 3, but 'data' has batch = 2"),
    (dict(**{"data:size1": torch.tensor([9, 12], dtype=torch.int32)}), r"lengths 'data:size1' \[9, 12\] do not fit"),
], ids=["missing_lengths", "unknown_input", "float64", "rank_2", "wrong_static_dim", "lengths_batch_3", "lengths_too_long"])
def test_a_bad_example_is_one_error_naming_the_input_before_any_export(change, message, tmp_path):
    model, inputs, outputs = _examples_job()
    example = _named_example(2, 9)
    drop = change.pop("drop", None)
    example.update(change)
    if drop:
        del example[drop]
    with pytest.raises(onnx_compat.SpecError, match=message):
        onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, examples=[example])
    assert not (tmp_path / "m.onnx").exists()


def test_a_dim_named_by_a_string_is_that_dim_and_a_bad_dim_is_named():
    """``["batch", 4, "time"]`` is what ``dynamic_axes`` users write: it means ``Dim("batch")``, ``Dim("time")``."""
    spec = TensorSpec("x", ["batch", np.int64(4), "time"])
    assert spec.dims == (Dim("batch"), 4, Dim("time")) and type(spec.dims[1]) is int
    assert TensorSpec("y", ["batch", None]).dims == (Dim("batch"), None)
    for bad in (4.0, True, -1, [3]):
        with pytest.raises(SpecError, match=rf"x: dim 1 is {re.escape(repr(bad))}; a dim is a Dim"):
            TensorSpec("x", ["batch", bad])
