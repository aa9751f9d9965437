"""Graph cleanup with onnxscript's optimizer and rewrite rules.

The TorchScript exporter leaves constant shape arithmetic that the dynamo
exporter folds itself; an asymmetric ``F.pad`` becomes a ~17-node subgraph
around one ``Pad``. onnxscript's maintained passes fold the constants
(``ConstantOfShape`` too, which it keeps by default: the pad subgraph starts
from one), remove no-ops, and fuse the ``Pad`` into the ``Conv`` as explicit
pads. The pipeline verifies again afterwards: cleanup must not change numbers
or dims.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnxscript import ir, optimizer, rewriter
from onnxscript.rewriter.rules import common as rules

# ConstantOfShape outputs larger than this stay in the graph (no bloated initializers).
_MAX_FOLDED_ELEMENTS = 4096
# Constant subgraphs over weights up to this size are folded (16 M elements, 64 MB float32).
_MAX_WEIGHT_ELEMENTS = 1 << 24


def _fold_small_constant_of_shape(node: "ir.Node"):
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return None  # the optimizer's own rules decide
    shape = node.inputs[0].const_value if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return None
    return math.prod(int(n) for n in shape.numpy().reshape(-1).tolist()) <= _MAX_FOLDED_ELEMENTS


def _rules():
    """The Pad-into-Conv rules; ``optimize`` has already applied onnxscript's default set."""
    return [getattr(rules, name) for name in ("normalize_pad_format_conv_rule", "fuse_pad_into_conv_rule")
            if hasattr(rules, name)]


def _register_orphan_constants(graph: "ir.Graph") -> None:
    """onnxscript 0.7.2's optimizer can leave a constant it created (the shape of a Flatten it turned
    into a Reshape, in Mimi's encoder) read by a node but owned by nothing: the model does not load.
    Such a value has its tensor, so it becomes the initializer it was meant to be."""
    inputs = set(graph.inputs)
    for node in graph:
        for value in node.inputs:
            if value is None or value.producer() is not None or value in inputs or value.is_initializer():
                continue
            if value.const_value is not None and value.name and value.name not in graph.initializers:
                graph.register_initializer(value)


def _fold_static_dims(graph: "ir.Graph") -> None:
    """``Gather(Shape(x), i)`` where dim ``i`` of ``x`` is static becomes that constant.

    The TorchScript tracer reads every size through ``Shape``, the static ones
    too (an FFT over a fixed 512-sample frame), and onnxscript 0.7.2 folds a
    ``Shape`` only when all of its dims are static: the tables computed from
    such a size stayed in the graph, recomputed on every run.
    """
    for node in list(graph):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        shape_node = node.inputs[0].producer() if node.inputs[0] is not None else None
        index = ir.convenience.get_const_tensor(node.inputs[1]) if node.inputs[1] is not None else None
        axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
        if shape_node is None or shape_node.op_type != "Shape" or index is None or axis != 0:
            continue
        source = shape_node.inputs[0].shape if shape_node.inputs[0] is not None else None
        if source is None:
            continue
        start = shape_node.attributes["start"].as_int() if "start" in shape_node.attributes else 0
        end = shape_node.attributes["end"].as_int() if "end" in shape_node.attributes else len(source)
        dims = list(source)[slice(start, end)]
        picked = np.asarray(index.numpy()).astype(np.int64)
        values = [dims[int(i)] for i in picked.reshape(-1)]
        if not all(isinstance(d, int) for d in values):
            continue
        folded = ir.Value(name=f"{node.outputs[0].name}_static",
                          const_value=ir.tensor(np.asarray(values, dtype=np.int64).reshape(picked.shape)))
        graph.register_initializer(folded)
        ir.convenience.replace_all_uses_with(node.outputs[0], folded)
        if node.outputs[0] in graph.outputs:
            graph.outputs[graph.outputs.index(node.outputs[0])] = folded


def cleanup(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A cleaned copy of ``proto``: constants folded, no-ops removed, Pad fused into Conv."""
    model = ir.serde.deserialize_model(proto)
    _fold_static_dims(model.graph)
    # Weight-sized inputs too: the RNN translation reorders LSTM/GRU gates of constant weights.
    optimizer.fold_constants(model, should_fold=_fold_small_constant_of_shape, input_size_limit=_MAX_WEIGHT_ELEMENTS,
                             output_size_limit=_MAX_WEIGHT_ELEMENTS)
    optimizer.optimize(model, num_iterations=1)  # a second round finds nothing more here, at twice the cost
    model = rewriter.rewrite(model, _rules())
    _register_orphan_constants(model.graph)
    out = ir.serde.serialize_model(model)
    del out.metadata_props[:]
    out.metadata_props.extend(proto.metadata_props)
    return out
