"""The remainders of sizes a TorchScript trace computed, so that verification also runs where they are zero.

Block attention pads the frames to a multiple of its block: ``remainder = T % 20; if remainder > 0: pad``
(transformers' Granite speech encoder). The TorchScript tracer bakes the branch the example takes: at T = 37 the
pad is in the graph, and the graph verified at T = 23, 53 and 30 (none a multiple of 20) failed in ONNX Runtime
at T = 20, 40, 60, where the eager model takes the other branch. The trace keeps the remainder itself as an op
(``aten::remainder`` of a size and a constant), dead or not; each such divisor found while the trace is made
adds one verification shape with every dynamic dim past the batch a multiple of it, so a graph that holds only
one side of the branch fails verification instead of being written.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, List, Optional, Sequence

from onnx_compat.spec import Dim, TensorSpec, verification_sizes

_REMAINDERS = ("aten::remainder", "aten::fmod")
# what a size passes through on its way to a remainder: scalar arithmetic on sizes, as the tracer records it
_SIZE_ARITHMETIC = ("aten::add", "aten::sub", "aten::mul", "aten::floor_divide", "aten::div", "aten::neg",
                    "aten::Int", "aten::ScalarImplicit", "prim::NumToTensor", "aten::to", "aten::detach")
_MOST = 2  # extra verification shapes at most: one per divisor, the first found


@contextlib.contextmanager
def recorded(graph_module, found: List[int]) -> Iterator[None]:
    """While open, each TorchScript trace (``graph_module._trace_and_get_graph_from_model``) adds to ``found``
    the divisors of the sizes' remainders it computed."""
    from onnx_compat.pipeline.sized_trace import each_trace

    def traced(original, model, args):
        graph, out = original(model, args)
        found.extend(d for d in divisors(graph) if d not in found)
        return graph, out
    with each_trace(graph_module, traced):
        yield


def divisors(graph) -> List[int]:
    """The constant divisors ``c > 1`` of ``aten::remainder``/``aten::fmod`` nodes whose dividend is a size."""
    found = []
    for node in graph.nodes():
        if node.kind() not in _REMAINDERS:
            continue
        dividend, divisor = list(node.inputs())[:2]
        c = _constant_int(divisor)
        if c is not None and c > 1 and _from_a_size(dividend) and c not in found:
            found.append(c)
    return found


# what a size passes through in an ONNX graph on its way to a ``Mod``
_ONNX_SIZE_ARITHMETIC = ("Gather", "Squeeze", "Unsqueeze", "Cast", "Add", "Sub", "Mul", "Div", "Max", "Min", "Reshape",
                         "Identity", "Slice", "Concat", "Ceil", "Floor", "Neg")


def divisors_in_graph(proto) -> List[int]:
    """The same in an exported ONNX graph (dynamo keeps a remainder of a size as a ``Mod`` of a ``Shape``):
    the constant divisors ``c > 1`` of ``Mod`` nodes whose dividend is computed from a ``Shape``."""
    import onnx
    from onnx import numpy_helper
    constants = {t.name: t for t in proto.graph.initializer}
    made = {}
    for node in proto.graph.node:
        for out in node.output:
            made[out] = node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            constants[node.output[0]] = node.attribute[0].t
    found = []
    for node in proto.graph.node:
        if node.op_type != "Mod" or len(node.input) < 2 or node.input[1] not in constants:
            continue
        value = numpy_helper.to_array(constants[node.input[1]])
        if value.size != 1 or value.dtype.kind not in "iu":
            continue
        c = int(value.reshape(-1)[0])
        if c > 1 and c not in found and _onnx_from_a_shape(node.input[0], made, 12):
            found.append(c)
    return found


def _onnx_from_a_shape(name: str, made: dict, depth: int) -> bool:
    node = made.get(name)
    if node is None or depth == 0:
        return False
    if node.op_type == "Shape":
        return True
    return node.op_type in _ONNX_SIZE_ARITHMETIC and any(_onnx_from_a_shape(i, made, depth - 1) for i in node.input)


def _constant_int(value) -> Optional[int]:
    node = value.node()
    while node.kind() in ("prim::NumToTensor", "aten::Int", "aten::ScalarImplicit"):
        node = next(iter(node.inputs())).node()
    if node.kind() != "prim::Constant" or not node.hasAttribute("value"):
        return None
    kind = node.kindOf("value")
    if kind == "i":
        return node.i("value")
    if kind == "t":
        t = node.t("value")
        return int(t.item()) if t.numel() == 1 and not t.dtype.is_floating_point else None
    return None


def _from_a_size(value, depth: int = 12) -> bool:
    """``value`` is computed from a tensor's size by scalar arithmetic (at most ``depth`` steps back)."""
    node = value.node()
    if node.kind() == "aten::size":
        return True
    if depth == 0 or node.kind() not in _SIZE_ARITHMETIC:
        return False
    return any(_from_a_size(v, depth - 1) for v in node.inputs())


def shapes(inputs: Sequence[TensorSpec], example: Dict[str, int], found: Sequence[int]) -> Optional[List[Dict[str, int]]]:
    """The default verification shapes and one at a multiple of each divisor in ``found``; None (the default
    three) when that adds none."""
    extra = extra_sizes(inputs, dict(example), list(dict.fromkeys(found))) if found else []
    return verification_sizes(inputs, example) + extra if extra else None


def extra_sizes(inputs: Sequence[TensorSpec], example: Dict[str, int], found: Sequence[int]) -> List[Dict[str, int]]:
    """One verification shape per divisor (the first ``_MOST``): the second default shape with each dynamic dim
    past the batch the nearest allowed multiple of it, where that differs from the example; none where no dim
    can be such a multiple."""
    dims = {d.name: (axis, d) for s in inputs for axis, d in s.dynamic_axes().items()}
    base = verification_sizes(inputs, example)[1]
    out = []
    for c in list(found)[:_MOST]:
        sizes = dict(base)
        for name, (axis, dim) in dims.items():
            if axis != 0:
                sizes[name] = _multiple_near(dim, base[name], c) or sizes[name]
        if sizes != base and sizes != example and sizes not in out:
            out.append(sizes)
    return out


def _multiple_near(dim: Dim, size: int, c: int) -> Optional[int]:
    step = c * dim.multiple // math.gcd(c, dim.multiple)
    for k in (max(1, round(size / step)), max(1, round(size / step)) + 1):
        if dim.min <= k * step and (dim.max is None or k * step <= dim.max):
            return k * step
    return None
