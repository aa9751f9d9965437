"""onnxscript's two-output rule (``SlicesSplit``) matched among the tried node's consumers while patched
(``patches/multi_output_matches.py``): the same rewrites as onnxscript's search of the whole graph, in every
order the Slices can come in, and a number of tries that grows with the Slices, not with their square."""
import contextlib
import itertools
import random

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import onnx_compat

ir = pytest.importorskip("onnx_ir")
optimizer = pytest.importorskip("onnxscript.optimizer")
_matcher = pytest.importorskip("onnxscript.rewriter._matcher")

pytestmark = pytest.mark.skipif("multi_output_matches" not in onnx_compat.available_patches(),
                                reason="onnxscript is not installed or has no such matcher")


def _constant(name, values):
    return oh.make_node("Constant", [], [name], value=oh.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values))


_SLICES = {  # output: (input, start, end, axes); x is [4, 16], r = Relu(x)
    "a": ("x", "s0", "e0", "last"), "b": ("x", "s1", "e1", "last"), "b_again": ("x", "s1", "e1", "last"),
    "rows": ("x", "s0", "e0", "first"), "ra": ("r", "s0", "e0", "last"), "rb": ("r", "s1", "e1", "last")}


def _graph(order):
    """Halves of x and of Relu(x) on the last axis (SlicesSplit's pattern), a duplicate half and a Slice of
    another axis, in the given order: onnxscript's check accepts the first pair it finds, so which pairs
    become a Split depends on the order."""
    constants = [_constant("s0", [0]), _constant("e0", [8]), _constant("s1", [8]), _constant("e1", [16]),
                 _constant("last", [-1]), _constant("first", [0])]
    slices = [oh.make_node("Slice", list(_SLICES[name]), [name]) for name in order]
    rest = [oh.make_node("Sub", ["a", "b"], ["d"]), oh.make_node("Add", ["d", "b_again"], ["f"]),
            oh.make_node("ReduceSum", ["rows"], ["summed"], keepdims=1), oh.make_node("Mul", ["ra", "rb"], ["g"]),
            oh.make_node("Add", ["f", "g"], ["f2"]), oh.make_node("Add", ["f2", "summed"], ["y"])]
    graph = oh.make_graph(constants + [oh.make_node("Relu", ["x"], ["r"])] + slices + rest, "halves",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _optimized(proto, patched: bool):
    model = ir.serde.deserialize_model(proto)
    with onnx_compat.patched(only=["multi_output_matches"]) if patched else contextlib.nullcontext():
        optimizer.optimize_ir(model)
    return ir.serde.serialize_model(model)


def test_the_same_rewrites_in_every_order_the_slices_come_in():
    import onnxruntime as ort
    orders = list(itertools.permutations(_SLICES))
    random.Random(0).shuffle(orders)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    splits = []
    for order in orders[:40]:
        graphs = [_optimized(_graph(order), patched) for patched in (False, True)]
        nodes = [[(n.op_type, list(n.input), list(n.output)) for n in g.graph.node] for g in graphs]
        assert nodes[1] == nodes[0], f"order {order}: the patched optimiser wrote another graph"
        got = [ort.InferenceSession(g.SerializeToString()).run(None, {"x": x})[0] for g in graphs]
        assert np.array_equal(got[0], got[1]) and np.abs(got[0]).max() > 0.1, order
        splits.append(sum(n.op_type == "Split" for n in graphs[1].graph.node))
    assert 0 in splits and max(splits) >= 1, f"the sample must hold orders with and without a Split: {splits}"


def _many_halves(count: int):
    """``count`` tensors, each cut into its halves on the last axis (one pair each: ``count`` Splits to make)."""
    nodes = [_constant("s0", [0]), _constant("e0", [8]), _constant("s1", [8]), _constant("e1", [16]),
             _constant("last", [-1])]
    outputs = []
    for k in range(count):
        nodes += [oh.make_node("Constant", [], [f"c{k}"], value=oh.make_tensor(f"c{k}", onnx.TensorProto.FLOAT, [],
                                                                               [k + 1.0])),
                  oh.make_node("Mul", ["x", f"c{k}"], [f"t{k}"]),
                  oh.make_node("Slice", [f"t{k}", "s1", "e1", "last"], [f"hi{k}"]),
                  oh.make_node("Slice", [f"t{k}", "s0", "e0", "last"], [f"lo{k}"]),
                  oh.make_node("Sub", [f"lo{k}", f"hi{k}"], [f"y{k}"])]
        outputs.append(oh.make_tensor_value_info(f"y{k}", onnx.TensorProto.FLOAT, None))
    graph = oh.make_graph(nodes, "many", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])], outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_pairs_tried_grow_with_the_slices_not_their_square(monkeypatch):
    """Each pair onnxscript's matcher tries is one ``_multi_match``: while patched, a Slice is tried only with the
    Slices of its own input (here two), where onnxscript's own search tries it with every Slice of the graph."""
    tried = []
    original = _matcher.SimplePatternMatcher._multi_match

    def counted(self, candidate, check_removable):
        tried.append(1)
        return original(self, candidate, check_removable)
    monkeypatch.setattr(_matcher.SimplePatternMatcher, "_multi_match", counted)
    count = 60
    found = {}
    for patched in (False, True):
        tried.clear()
        graph = _optimized(_many_halves(count), patched)
        found[patched] = (len(tried), sum(n.op_type == "Split" for n in graph.graph.node), len(graph.graph.node))
    (whole, splits_whole, nodes_whole), (ours, splits_ours, nodes_ours) = found[False], found[True]
    assert splits_ours == splits_whole == count and nodes_ours == nodes_whole, found
    slices_per_pass = 2 * count
    assert ours <= 2 * slices_per_pass * 2, f"{ours} pairs tried for {slices_per_pass} Slices (two passes)"
    assert whole > 10 * ours, f"onnxscript's own search tried {whole}, ours {ours}"


def test_a_partner_sharing_no_variable_is_left_to_onnxscript():
    from onnxscript.rewriter import _pattern_ir
    from onnx_compat.patches.multi_output_matches import partner_candidates

    def shared(op, x, starts0, ends0, starts1, ends1):
        return op.Slice(x, starts0, ends0), op.Slice(x, starts1, ends1)

    def unshared(op, x, y):
        return op.Relu(x), op.Sigmoid(y)
    model = ir.serde.deserialize_model(_graph(list(_SLICES)))
    first_slice = next(n for n in model.graph if n.op_type == "Slice")
    found = {}
    for fn in (shared, unshared):
        pattern = _pattern_ir._to_graph_pattern(fn)
        assert not pattern.has_single_output_node
        found[fn.__name__] = partner_candidates(pattern, model.graph, first_slice)
    assert found["unshared"] is None
    partners = [n.outputs[0].name for n in found["shared"][0]]
    assert partners == ["a", "b", "b_again", "rows"], partners  # x's Slices, in graph order, the tried one first
