"""What an ONNX model holds: I/O with symbolic dims, ops, deprecated attributes, metadata."""
from __future__ import annotations

import collections
import os
from typing import Dict, List, Union

import onnx

DTYPES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}


def load(model: Union[str, os.PathLike, onnx.ModelProto]) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model), load_external_data=False)


def value_info(value: onnx.ValueInfoProto) -> dict:
    t = value.type.tensor_type
    dims = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in t.shape.dim]
    return {"name": value.name, "dtype": DTYPES.get(t.elem_type, str(t.elem_type)), "dims": dims}


def op_histogram(proto: onnx.ModelProto) -> Dict[str, int]:
    counts = collections.Counter(n.op_type for n in proto.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def auto_pad_nodes(proto: onnx.ModelProto) -> List[str]:
    """Conv-like nodes using the deprecated ``auto_pad`` (anything but NOTSET)."""
    return [n.name or n.op_type for n in proto.graph.node
            if any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in n.attribute)]


def inspect(model: Union[str, os.PathLike, onnx.ModelProto]) -> dict:
    """A summary of ``model``: opset, I/O, node count, op histogram, auto_pad, metadata."""
    proto = load(model)
    return {
        "opset": {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import},
        "inputs": [value_info(v) for v in proto.graph.input],
        "outputs": [value_info(v) for v in proto.graph.output],
        "nodes": len(proto.graph.node),
        "ops": op_histogram(proto),
        "auto_pad": auto_pad_nodes(proto),
        "metadata": {p.key: p.value for p in proto.metadata_props},
    }


def static_where_dynamic(proto: onnx.ModelProto, wanted: Dict[str, Dict[int, str]]) -> List[str]:
    """Dims asked to be dynamic (``{io_name: {axis: dim_name}}``) that the graph has static."""
    values = {v.name: v for v in list(proto.graph.input) + list(proto.graph.output)}
    problems = []
    for name, axes in wanted.items():
        if name not in values:
            problems.append(f"{name!r} is not in the graph: the exporter dropped it (is it used in a traced computation?)")
            continue
        dims = value_info(values[name])["dims"]
        for axis, dim_name in axes.items():
            if axis >= len(dims) or not isinstance(dims[axis], str):
                got = dims[axis] if axis < len(dims) else "missing"
                problems.append(f"{name!r} dim {axis} ({dim_name!r}) was requested dynamic but is {got} in the graph")
    return problems


def set_metadata(proto: onnx.ModelProto, entries: Dict[str, str]) -> None:
    existing = {p.key: p for p in proto.metadata_props}
    for key, value in entries.items():
        if not isinstance(value, str):
            raise TypeError(f"metadata {key!r}: values must be strings, got {type(value).__name__}")
        if key in existing:
            existing[key].value = value
        else:
            proto.metadata_props.add(key=key, value=value)
