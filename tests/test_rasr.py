"""RASR's rules, one finding per broken rule, on hand-made graphs."""
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_compat import check_rasr

F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def graph(inputs, outputs):
    """Inputs/outputs as (name, dtype, dims); outputs computed by Identity/Cast of the first input."""
    ins = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
    outs = [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs]
    nodes = [helper.make_node("Identity", [inputs[0][0]], [o[0]]) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs))


GOOD_IN = [("data", F32, ["B", "T", 40]), ("data:size1", I32, ["B"])]
GOOD_OUT = [("output", F32, ["B", "T", 10])]


def test_a_good_model_fits_both_roles():
    check = check_rasr(graph(GOOD_IN, GOOD_OUT), feature_dim=40)
    assert check.ok and check.roles() == ["feature-scorer", "encoder"]


def test_subsampled_output_fits_only_the_encoder():
    check = check_rasr(graph(GOOD_IN, [("output", F32, ["B", "T4", 10])]))
    assert check.ok and check.roles() == ["encoder"]


@pytest.mark.parametrize("inputs, outputs, kwargs, match", [
    ([("data", F32, ["B", "T", 40]), ("data:size1", I64, ["B"])], GOOD_OUT, {}, "dtype must be int32, is int64"),
    ([("data", F32, ["B", "T", "F"]), ("data:size1", I32, ["B"])], GOOD_OUT, {}, "feature dim must be static"),
    ([("data", F32, ["B", 50, 40]), ("data:size1", I32, ["B"])], GOOD_OUT, {}, "time dim must be symbolic"),
    ([("data", F32, [2, "T", 40]), ("data:size1", I32, ["B"])], GOOD_OUT, {}, "batch dim must be symbolic or 1"),
    ([("data", F32, ["B", "T"]), ("data:size1", I32, ["B"])], GOOD_OUT, {}, "rank must be 3"),
    (GOOD_IN, [("output", F32, ["B", "T", "C"])], {}, "class dim must be static"),
    (GOOD_IN, [("output", F32, ["B", 7, 10])], {}, "time dim must be symbolic"),
    (GOOD_IN, [("logits", F32, ["B", "T", 10])], {}, "no output 'output'"),
    (GOOD_IN, GOOD_OUT, {"feature_dim": 80}, "RASR's feature dim is 80"),
    (GOOD_IN + [("state", F32, ["B", 4])], GOOD_OUT, {}, "'state' is not mapped"),
    (GOOD_IN, GOOD_OUT, {"features_size": None}, "'data:size1' is not mapped"),
], ids=["int64_lengths", "dynamic_features", "static_input_time", "static_batch", "rank_2", "dynamic_classes",
        "static_output_time", "no_output", "other_feature_dim", "unmapped_state", "unmapped_lengths"])
def test_each_broken_rule_is_one_finding(inputs, outputs, kwargs, match):
    check = check_rasr(graph(inputs, outputs), **kwargs)
    assert not check.ok and check.roles() == []
    assert len([f for f in check.findings if match in f]) == 1, check.findings


def test_batch_of_one_is_allowed(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(graph([("data", F32, [1, "T", 40]), ("data:size1", I32, ["B"])], [("output", F32, [1, "T", 10])]), path)
    assert check_rasr(str(path)).ok
