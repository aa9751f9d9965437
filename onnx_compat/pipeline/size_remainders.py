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
# a size as it is read, no arithmetic: a size rounded to a multiple counts only then (``T // c * c``), not where a
# width is rounded (``(k - 1 + T) // 2 * 2``, "same" padding: zoo models at every length)
_SIZE_READS = ("prim::NumToTensor", "aten::Int", "aten::ScalarImplicit", "aten::to", "aten::detach")


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
    """The constant divisors ``c > 1`` of the remainders of sizes in a TorchScript graph: ``aten::remainder`` /
    ``aten::fmod`` of a size by ``c``, or a size rounded down to a multiple of ``c`` (``T // c * c``, the
    remainder in another spelling: ``if T // c * c != T:``)."""
    found = []
    for node in graph.nodes():
        c = _remainder_divisor(node) if node.kind() in _REMAINDERS else \
            _rounded_divisor(node) if node.kind() == "aten::mul" else None
        if c is not None and c > 1 and c not in found:
            found.append(c)
    return found


def _remainder_divisor(node) -> Optional[int]:
    dividend, divisor = list(node.inputs())[:2]
    return _constant_int(divisor) if _from_a_size(dividend) else None


def _rounded_divisor(node) -> Optional[int]:
    """``c`` of ``aten::mul(aten::floor_divide(size, c), c)`` (either operand order), else None."""
    a, b = list(node.inputs())[:2]
    for quotient, factor in ((a, b), (b, a)):
        c = _constant_int(factor)
        inner = quotient.node()
        if c is not None and inner.kind() == "aten::floor_divide":
            dividend, divisor = list(inner.inputs())[:2]
            if _constant_int(divisor) == c and _from_a_size(dividend, _SIZE_READS):
                return c
    return None


# what a size passes through in an ONNX graph on its way to a ``Mod``; to a rounding, only its reads
_ONNX_SIZE_READS = ("Gather", "Squeeze", "Unsqueeze", "Cast", "Reshape", "Identity", "Slice", "Concat")
_ONNX_SIZE_ARITHMETIC = _ONNX_SIZE_READS + ("Add", "Sub", "Mul", "Div", "Max", "Min", "Ceil", "Floor", "Neg")


def divisors_in_graph(proto) -> List[int]:
    """The same in an exported ONNX graph (dynamo keeps a remainder of a size as a ``Mod`` of a ``Shape``):
    the constant divisors ``c > 1`` of ``Mod`` nodes whose dividend is computed from a ``Shape``, and of a size
    rounded to a multiple (``_onnx_rounded``)."""
    import onnx
    from onnx import numpy_helper
    constants = {t.name: t for t in proto.graph.initializer}
    made = {}
    for node in proto.graph.node:
        for out in node.output:
            made[out] = node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            constants[node.output[0]] = node.attribute[0].t
    def number(name) -> Optional[float]:
        tensor = constants.get(name)
        # one element, in the graph: a weight kept in a file (the on-disk path) is never read here, nor a big one
        if tensor is None or math.prod(tensor.dims) != 1 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value = numpy_helper.to_array(tensor)
        if value.dtype.kind not in "biuf":
            return None
        return float(value.reshape(-1)[0])

    found = []
    for node in proto.graph.node:
        if node.op_type == "Mod" and len(node.input) == 2 and _onnx_from_a_shape(node.input[0], made, 12):
            c = number(node.input[1])
        elif node.op_type == "Mul" and len(node.input) == 2:
            c = _onnx_rounded(node, made, number)
        else:
            continue
        if c is not None and c == int(c) and c > 1 and int(c) not in found:
            found.append(int(c))
    return found


def _onnx_rounded(node, made: dict, number) -> Optional[float]:
    """``c`` of a size rounded to a multiple of ``c``: ``Mul(Div(size, c), c)`` (an integer ``Div`` rounds down:
    ``T // c * c``), a ``Floor``/``Ceil`` and ``Cast`` between them (``math.ceil(T / c) * c``); else None."""
    for quotient, factor in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        c, inner, rounded = number(factor), made.get(quotient), False
        while inner is not None and inner.op_type in ("Cast", "Ceil", "Floor"):
            rounded |= inner.op_type != "Cast"
            inner = made.get(inner.input[0])
        if c is None or inner is None or inner.op_type != "Div" or number(inner.input[1]) != c:
            continue
        # without Floor/Ceil only an integer Div rounds: one whose size was not cast to a float first
        if (rounded or getattr(made.get(inner.input[0]), "op_type", None) != "Cast") \
                and _onnx_from_a_shape(inner.input[0], made, 12, _ONNX_SIZE_READS):
            return c
    return None


def _onnx_from_a_shape(name: str, made: dict, depth: int, through=_ONNX_SIZE_ARITHMETIC) -> bool:
    node = made.get(name)
    if node is None or depth == 0:
        return False
    if node.op_type == "Shape":
        return True
    return node.op_type in through and any(_onnx_from_a_shape(i, made, depth - 1, through) for i in node.input)


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
        # an integer only: a float or complex constant (``x * 1j``, a spectrum's phase) is no divisor
        return int(t.item()) if t.numel() == 1 and not (t.dtype.is_floating_point or t.dtype.is_complex) else None
    return None


def _from_a_size(value, through=_SIZE_ARITHMETIC, depth: int = 12) -> bool:
    """``value`` is computed from a tensor's size by the ops ``through`` (at most ``depth`` steps back)."""
    node = value.node()
    if node.kind() == "aten::size":
        return True
    if depth == 0 or node.kind() not in through:
        return False
    return any(_from_a_size(v, through, depth - 1) for v in node.inputs())


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
