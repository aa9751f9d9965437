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


def cleanup(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A cleaned copy of ``proto``: constants folded, no-ops removed, Pad fused into Conv."""
    model = ir.serde.deserialize_model(proto)
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
