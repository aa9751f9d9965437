"""Graph rewrites that make our exports right in OpenVINO as well, without changing what they compute.

Measured with openvino 2026.4.1 (CPU, f32) against ONNX Runtime:

- ONNX ``LSTM``/``GRU`` ``sequence_lens`` is ignored. Forward: the valid
  frames are right, but the padded frames are not zero and ``Y_h`` is the
  state at the batch's last frame instead of each item's; reverse: each
  item's backward pass starts at the batch's last frame, so every shorter
  item is wrong (our packed BLSTM export: off by 3e-2 whenever lengths
  differ; batch 1 and equal lengths are exact). Rewritten as one
  single-direction node per direction *without* ``sequence_lens``: the
  backward one runs on ``ReverseSequence(X, lens)`` (each item reversed
  within its own length, so it starts at its own last frame) and its output
  is reversed back; padded frames are zeroed with a length mask; ``Y_h`` is
  picked at frame ``len - 1`` of each direction's own run. The same formulas
  ONNX defines, so ONNX Runtime's outputs do not change (verified). A node
  whose ``Y_c`` is used is left as it is and named in the result: the cell
  state at ``len - 1`` is not among the outputs of a run without lengths.
- A graph output made by a ``Cast`` to the type its input already has
  (TorchScript returns ``output:size1 = Cast(data:size1)``): OpenVINO removes
  the Cast, and with its default input sharing (``compiled_model(feeds)``)
  the output then reads memory of an earlier call: after a larger batch, a
  smaller one returned garbage lengths. An ``Identity`` there (what dynamo
  writes) is right.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import onnx
from onnx import TensorProto, helper

from onnx_compat.int_repair import _without_weights as without_weights  # weights as inputs: types only


@dataclass
class Rewrite:
    """What a pass did: ``changes`` (one line per rewritten node) and ``kept`` (nodes it could not rewrite, why)."""

    changes: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)


def _declared_types(proto: onnx.ModelProto) -> Dict[str, int]:
    """Element type of every value the graph declares (inputs, initializers, annotated values, outputs)."""
    types = {t.name: t.data_type for t in proto.graph.initializer}
    for v in list(proto.graph.input) + list(proto.graph.value_info) + list(proto.graph.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    return types


def _elem_types(proto: onnx.ModelProto) -> Dict[str, int]:
    """Element type of every value whose type is known (declared, or inferred for intermediates). Inferred on
    the graph with its weights declared as inputs: element types never depend on a weight's values, and
    ``infer_shapes`` serialises the model it is given (a 9.6 MiB BLSTM held in memory: 0.02 s of a 0.15 s
    bare export; a 98 MiB Conformer: 0.3-0.6 s)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weights(proto))
    except Exception:  # noqa: BLE001 - without inference, the graph's own annotations are all there is
        inferred = proto
    return {**_declared_types(proto), **_declared_types(inferred)}


def same_type_casts(proto: onnx.ModelProto) -> Rewrite:
    """A graph output made by a ``Cast`` to its input's own type -> ``Identity``. Only outputs: inside the
    graph OpenVINO drops such a Cast harmlessly; at an output it leaves the output aliasing its input.
    Types are inferred only when a Cast's input has none declared: inference serialises the whole model,
    weights and all (12 x 256 MHA encoder, 38 MB: 0.16 s for the lengths' Cast, whose input is a graph input)."""
    done, outputs = Rewrite(), {o.name for o in proto.graph.output}
    casts = [n for n in proto.graph.node
             if n.op_type == "Cast" and n.domain in ("", "ai.onnx") and n.output[0] in outputs]
    types = _declared_types(proto) if casts else {}
    if any(n.input[0] not in types for n in casts):
        types = _elem_types(proto)
    for node in casts:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to is not None and types.get(node.input[0]) == to:
            node.op_type = "Identity"
            del node.attribute[:]
            done.changes.append(f"output {node.output[0]!r}: Cast to its own type ({TensorProto.DataType.Name(to)}) "
                                "-> Identity")
    return done


_GATES = {"LSTM": 3, "GRU": 2}  # activation functions per direction
_STATE_INPUTS = {"LSTM": (5, 6, 7), "GRU": (5,)}  # initial_h, initial_c, P: per direction like W, R, B


class _Builder:
    """New nodes for one rewritten RNN node, their values named after it."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.count = prefix, [], 0

    def __call__(self, op: str, inputs, outputs: int = 1, **attrs):
        names = [f"{self.prefix}__ov{self.count}_{k}" for k in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op, list(inputs), names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    def const(self, values, dtype=TensorProto.INT64) -> str:
        return self("Constant", [], value=helper.make_tensor(f"{self.prefix}__c{self.count}", dtype, [len(values)], values))

    def scalar(self, value: int) -> str:
        return self("Constant", [], value=helper.make_tensor(f"{self.prefix}__c{self.count}", TensorProto.INT64, [], [value]))


def _used(proto: onnx.ModelProto, name: str) -> bool:
    return bool(name) and (any(name in n.input for n in proto.graph.node) or any(o.name == name for o in proto.graph.output))


def _attrs(node) -> Dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _direction_node(b: _Builder, node, attrs, d: int, x: str, outputs: int) -> List[str]:
    """One direction of ``node`` as a forward node without ``sequence_lens``: [Y, Y_h, (Y_c)]."""
    k, own = _GATES[node.op_type], dict(attrs)
    own.update(direction="forward", layout=0)
    for key in ("activations", "activation_alpha", "activation_beta"):
        if key in own and len(own[key]) >= (d + 1) * k:
            own[key] = own[key][d * k:(d + 1) * k]
    own = {key: (v.decode() if isinstance(v, bytes) else [s.decode() if isinstance(s, bytes) else s for s in v]
                 if isinstance(v, list) else v) for key, v in own.items()}
    take = lambda i: b("Slice", [node.input[i], b.const([d]), b.const([d + 1]), b.const([0])]) \
        if i < len(node.input) and node.input[i] else ""  # noqa: E731
    ins = [x, take(1), take(2), take(3), ""] + [take(i) for i in _STATE_INPUTS[node.op_type]]
    while ins and not ins[-1]:
        ins.pop()
    return b(node.op_type, ins, outputs, **own)


def _split_packed(proto: onnx.ModelProto, node, b: _Builder) -> Optional[str]:
    """Replace ``node`` (LSTM/GRU with sequence_lens) by per-direction nodes; None, or why it was kept."""
    attrs = _attrs(node)
    if attrs.get("layout", 0) != 0:
        return "layout=1 (batch-first), which ONNX Runtime does not run either"
    outs = list(node.output) + [""] * (3 - len(node.output))
    if node.op_type == "LSTM" and _used(proto, outs[2]):
        return "its Y_c (cell state) is used, and a run without sequence_lens has no cell state at len - 1"
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    x, lens = node.input[0], b("Cast", [node.input[4]], to=TensorProto.INT64)
    steps = b("Squeeze", [b("Gather", [b("Shape", [x]), b.const([0])]), b.const([0])])
    frames = b("Unsqueeze", [b("Range", [b.scalar(0), steps, b.scalar(1)]), b.const([1])])  # [T, 1]
    row = b("Unsqueeze", [lens, b.const([0])])  # [1, B]
    valid = b("Unsqueeze", [b("CastLike", [b("Less", [frames, row]), x]), b.const([1, 3])])  # [T, 1, B, 1]
    last = b("Max", [b("Sub", [row, b.const([1])]), b.const([0])])
    at_last = b("Unsqueeze", [b("CastLike", [b("Equal", [frames, last]), x]), b.const([1, 3])])
    ys, hs = [], []
    for d, name in enumerate(dirs):
        run_x = x if name == "forward" else b("ReverseSequence", [x, lens], batch_axis=1, time_axis=0)
        y = _direction_node(b, node, attrs, d, run_x, 2)[0]  # [T, 1, B, H]
        hs.append(b("ReduceSum", [b("Mul", [y, at_last]), b.const([0])], keepdims=0))  # [1, B, H]
        if name == "reverse":
            y = b("Unsqueeze", [b("ReverseSequence", [b("Squeeze", [y, b.const([1])]), lens], batch_axis=1, time_axis=0),
                                b.const([1])])
        ys.append(b("Mul", [y, valid]))
    for out, parts, axis in ((outs[0], ys, 1), (outs[1], hs, 0)):
        if out:
            b.nodes.append(helper.make_node("Concat", parts, [out], axis=axis) if len(parts) > 1
                           else helper.make_node("Identity", parts, [out]))
    return None


def packed_recurrent(proto: onnx.ModelProto) -> Rewrite:
    """Every top-level LSTM/GRU with ``sequence_lens``, split per direction without it (see the module doc)."""
    done, rebuilt = Rewrite(), []
    for k, node in enumerate(proto.graph.node):
        if node.op_type in _GATES and node.domain in ("", "ai.onnx") and len(node.input) > 4 and node.input[4]:
            b = _Builder(f"{node.name or node.op_type}_{k}".replace("/", "_"))
            why = _split_packed(proto, node, b)
            if why is None:
                rebuilt.extend(b.nodes)
                done.changes.append(f"{node.op_type} {node.name or node.output[0]!r}: sequence_lens -> per-direction "
                                    "runs over ReverseSequence and a length mask")
                continue
            done.kept.append(f"{node.op_type} {node.name or node.output[0]!r}: {why}")
        rebuilt.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(rebuilt)
    return done


PASSES = (same_type_casts, packed_recurrent)


def fix_for_openvino(proto: onnx.ModelProto) -> Tuple[List[str], List[str]]:
    """Apply every pass to ``proto`` in place: (what changed, what could not be changed and why)."""
    changes, kept = [], []
    for rewrite in PASSES:
        done = rewrite(proto)
        changes += done.changes
        kept += done.kept
    return changes, kept
