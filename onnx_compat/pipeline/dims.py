"""How declared dims reach the exporters, and how they are read back.

Every exporter takes dynamic dims in its own form (``dynamic_axes`` names for
TorchScript, ``torch.export.Dim`` objects or hints for dynamo) and hands back
its own names; this module speaks both, so the specs stay the one place where
a dim is declared.
"""
from __future__ import annotations

import re
from typing import Dict, List, Sequence

import onnx
import torch

from onnx_compat.errors import NarrowedDim, StaticDim
from onnx_compat.spec import Dim, TensorSpec, size_name


def onnx_names(specs: Sequence[TensorSpec]) -> List[str]:
    return [n for spec in specs for n in spec.onnx_names]


def axes_of(specs: Sequence[TensorSpec]) -> Dict[str, Dict[int, Dim]]:
    """Dynamic axes per ONNX name, lengths tensors included (their batch axis)."""
    out: Dict[str, Dict[int, Dim]] = {}
    for spec in specs:
        axes = spec.dynamic_axes()
        out[spec.name] = axes
        for axis in spec.lengths:
            out[size_name(spec.name, axis)] = {0: axes[0]} if 0 in axes else {}
    return out


def wanted_dynamic(specs: Sequence[TensorSpec]) -> Dict[str, Dict[int, str]]:
    """``{onnx_name: {axis: dim_name}}`` of every dim the specs want dynamic."""
    return {name: {a: d.name for a, d in axes.items()} for name, axes in axes_of(specs).items()}


# ``Dim.DYNAMIC`` with bounds (torch >= 2.6): a hint, not a named symbol. A named ``torch.export.Dim``
# turns every guard torch.export cannot prove over the declared range into an error (e.g. ``len(x)``
# in non-strict mode, or ``ceil(T/2) != 1`` behind a broadcast), and ``torch.onnx.export`` then retries
# in other modes that quietly make the dim static. A hint lets torch.export narrow the range instead
# and still raises when the dim would become a constant.
_HINT = getattr(getattr(getattr(torch, "export", None), "Dim", None), "DYNAMIC", None)


def torch_dims(hint=None):
    dims: Dict[str, object] = {}
    hint = hint or _HINT

    def torch_dim(dim: Dim):
        k = dim.multiple
        if k == 1 and callable(hint):
            return hint(min=dim.min, **({"max": dim.max} if dim.max else {}))
        if dim.name not in dims:
            limits = {"min": -(-dim.min // k), **({"max": dim.max // k} if dim.max else {})}
            base = torch.export.Dim(dim.name if k == 1 else f"{dim.name}_div{k}", **limits)
            dims[dim.name] = base if k == 1 else k * base
        return dims[dim.name]
    return torch_dim


# torch.export's words for a dynamic-hinted dim the trace made static; the inputs are the adapter's flat
# ``*tensors``, in ONNX order (2.13: ``inputs['tensors'][0].shape[1]``, 2.15: ``inputs[0].shape[1]``)
_STATIC = re.compile(r"inferred a static shape of (\d+) for dimension inputs(?:\['tensors'\])?\[(\d+)\]\.shape\[(\d+)\]")


def cause_text(exc: BaseException) -> str:
    """The messages of ``exc`` and of every exception it was raised from: exporters wrap the real one."""
    text, seen = "", exc
    while seen is not None:
        text += "\n" + str(seen)
        seen = seen.__cause__
    return text


def static_dims(exc: BaseException, names: Sequence[str], axes: Dict[str, Dict[int, Dim]]) -> List[StaticDim]:
    """The dims torch.export's error says it made static, by the user's input and Dim names."""
    found: List[StaticDim] = []
    for size, index, axis in _STATIC.findall(cause_text(exc)):
        name = names[int(index)] if int(index) < len(names) else f"input {index}"
        dim = axes.get(name, {}).get(int(axis))
        item = StaticDim(name, int(axis), dim.name if dim is not None else None, int(size))
        if item not in found:
            found.append(item)
    return found


def narrowed_dims(program, names: Sequence[str], axes: Dict[str, Dict[int, Dim]],
                  examples: Sequence[torch.Tensor]) -> List[NarrowedDim]:
    """The dims torch.export bounded near the example's size. With dynamic hints, a guard such as
    ``Eq(CeilToInt(T/16), 250)`` does not fail the export: it becomes an upper bound on ``T`` in the
    program's ``range_constraints`` and the graph holds the example's value, silently wrong at other
    lengths. Only a bound under twice the example's size counts: a model's own limit (a position table of
    512) lies elsewhere, and a raised lower bound (a minimum length for the convolutions) is real."""
    ranges = getattr(program, "range_constraints", {}) or {}
    users = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in _user_inputs(program)]
    found: List[NarrowedDim] = []
    for name, node, example in zip(names, users, examples):
        shape = getattr(node.meta.get("val"), "shape", ())
        for axis, dim in axes.get(name, {}).items():
            high = _upper(shape[axis], ranges) if axis < len(shape) else None
            if high is not None and (dim.max is None or high < dim.max) and high < 2 * example.shape[axis]:
                found.append(NarrowedDim(name, axis, dim.name, high, dim.max))
    return found


def _user_inputs(program) -> set:
    return set(program.graph_signature.user_inputs)


def _upper(size, ranges) -> "int | None":
    """The largest value ``size`` (a SymInt of one symbol) may take, or None when unbounded or static."""
    expr = getattr(getattr(size, "node", None), "expr", None)
    if expr is None or len(expr.free_symbols) != 1:
        return None
    symbol = next(iter(expr.free_symbols))
    bound = ranges.get(symbol)
    import sympy  # here, not at import: 0.3 s that a TorchScript export never needs
    upper = getattr(bound, "upper", None)
    if not isinstance(upper, sympy.Integer):  # torch's int_oo is no Integer (and calls itself finite)
        return None
    return int(expr.subs(symbol, upper))


def name_dims(proto: onnx.ModelProto, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """Give symbolic dims the names the spec declares (dynamo derives its own for
    outputs, and writes ``10*samples_div10`` for a ``Dim(multiple=10)``)."""
    by_name = {v.name: v for v in list(proto.graph.input) + list(proto.graph.output)}
    for name, axes in axes_of(list(inputs) + list(outputs)).items():
        value = by_name.get(name)
        if value is None:
            continue
        shape = value.type.tensor_type.shape
        for axis, dim in axes.items():
            if axis < len(shape.dim) and shape.dim[axis].HasField("dim_param"):
                shape.dim[axis].dim_param = dim.name
