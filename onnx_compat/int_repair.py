"""Repair of mixed int32/int64 arithmetic: the casts that make such a model load.

Sequence models take int32 lengths (RASR requires them) and compute with them:
``T = lengths.max()`` then ``x.reshape(B, T, -1)``. PyTorch promotes int32 and
int64 silently; the TorchScript exporter writes the ops as traced, so the graph
holds a ``Concat`` (or ``Add``, ``Slice``, ``Range``, ...) whose inputs are int32
and int64, or an int32 shape where ONNX wants int64, and ONNX Runtime refuses to load it ("Type parameter (T) of Optype
(Concat) bound to different types (tensor(int64) and tensor(int32))"). This is
how RETURNN's Conformer export fails. The repair casts the int32 inputs of such
ops to int64, which is what PyTorch computed.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import onnx
from onnx import TensorProto, helper

# op -> which inputs must share one type (None: all)
_SAME_TYPE = {op: None for op in ("Concat", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Sum", "Mean",
                                  "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Range")}
_SAME_TYPE["Where"] = (1, 2)
_SAME_TYPE["Slice"] = (1, 2, 3, 4)
# op -> inputs the spec types as int64 only (a shape, pads, axes, repeats)
_INT64_ONLY = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Pad": (1,),
               "Unsqueeze": (1,), "Squeeze": (1,), "TopK": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
               "ReduceMax": (1,), "ReduceMin": (1,), "Resize": (3,)}
_INTS = {TensorProto.INT32, TensorProto.INT64}


def _without_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with initializers declared as inputs: type inference without copying weights."""
    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    g = light.graph
    g.node.extend(proto.graph.node)
    g.input.extend(proto.graph.input)
    g.output.extend(proto.graph.output)
    declared = {v.name for v in proto.graph.input}
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in proto.graph.initializer if t.name not in declared)
    return light


def _types(proto: onnx.ModelProto) -> Dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(_without_weights(proto), strict_mode=False)
    g = inferred.graph
    out = {i.name: i.data_type for i in proto.graph.initializer}
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            out[v.name] = v.type.tensor_type.elem_type
    for node in g.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = a.t.data_type
    return out


def _mixed(node, types) -> List[int]:
    """Indices of the int32 inputs of ``node`` that must become int64."""
    if node.op_type in _INT64_ONLY:
        return [i for i in _INT64_ONLY[node.op_type]
                if i < len(node.input) and node.input[i] and types.get(node.input[i]) == TensorProto.INT32]
    if node.op_type not in _SAME_TYPE:
        return []
    positions = _SAME_TYPE[node.op_type] or range(len(node.input))
    typed = {i: types.get(node.input[i]) for i in positions if i < len(node.input) and node.input[i]}
    if set(typed.values()) != _INTS:
        return []
    return [i for i, t in typed.items() if t == TensorProto.INT32]


REPAIRED_WHILE_EXPORTING = "onnx_compat_patched_repair_"  # the casts' names when patched() made them


def repaired_while_exporting(proto: onnx.ModelProto) -> List[str]:
    """The casts ``patched()`` already made in a TorchScript export (``patches/int_types.py``), said as the
    repair says its own, so a report lists them."""
    consumers = {name: node for node in proto.graph.node for name in node.input}
    out = []
    for node in proto.graph.node:
        if node.op_type == "Cast" and node.name.startswith(REPAIRED_WHILE_EXPORTING):
            user = consumers.get(node.output[0])
            where = f"{user.op_type} {user.name or user.output[0]!r}" if user is not None else "unused"
            out.append(f"{where}: input {node.input[0]!r} int32 -> int64 (while exporting)")
    return out


def repair_int_types(proto: onnx.ModelProto, max_rounds: int = 20,
                     prefix: str = "onnx_compat_repair_") -> Tuple[onnx.ModelProto, List[str]]:
    """``proto`` with int32 inputs of mixed-type ops cast to int64 (a copy; ``proto``
    itself when there is nothing to cast), and what was cast; the casts are named ``prefix`` and a number.

    Rounds repeat because a repaired node's output type becomes known only then.
    """
    types = _types(proto)
    if not any(_mixed(node, types) for node in proto.graph.node):
        return proto, []
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    done: List[str] = []
    for round_ in range(max_rounds):
        types = types if round_ == 0 else _types(fixed)
        nodes, changed = [], False
        for k, node in enumerate(fixed.graph.node):
            for i in _mixed(node, types):
                source = node.input[i]
                cast_name = f"{source}_as_int64_{k}_{i}"
                nodes.append(helper.make_node("Cast", [source], [cast_name], to=TensorProto.INT64,
                                              name=f"{prefix}{len(done)}"))
                node.input[i] = cast_name
                done.append(f"{node.op_type} {node.name or node.output[0]!r}: input {source!r} int32 -> int64")
                changed = True
            nodes.append(node)
        if not changed:
            break
        del fixed.graph.node[:]
        fixed.graph.node.extend(nodes)
    return fixed, done
