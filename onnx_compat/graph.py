"""What an ONNX model holds: I/O with symbolic dims, ops, deprecated attributes, metadata."""
from __future__ import annotations

import collections
import json
import math
import os
from typing import Dict, List, Mapping, Optional, Union

import onnx
from onnx import numpy_helper

from onnx_compat.errors import ArgumentError, ArgumentTypeError, ModelFileError

DTYPES = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}


def all_nodes(proto: onnx.ModelProto):
    """Every node of the graph, its subgraphs and its local functions."""
    yield from _nodes_below([proto.graph] + list(proto.functions))


def nested_nodes(proto: onnx.ModelProto):
    """Every node of the graph's subgraphs (a ``Loop``'s or an ``If``'s bodies) and of its local functions:
    the nodes that do not run once per call of the graph."""
    yield from _nodes_below([sub for node in proto.graph.node for sub in subgraphs(node)] + list(proto.functions))


def subgraphs(node: onnx.NodeProto) -> list:
    """The graphs a node holds in its attributes (a ``Loop``'s body, an ``If``'s branches)."""
    found = []
    for attr in node.attribute:
        if attr.HasField("g"):
            found.append(attr.g)
        found.extend(attr.graphs)
    return found


def _nodes_below(holders):
    stack = list(holders)
    while stack:
        holder = stack.pop()
        for node in holder.node:
            yield node
            stack.extend(subgraphs(node))


def load(model: Union[str, os.PathLike, onnx.ModelProto], load_external_data: bool = False) -> onnx.ModelProto:
    """``model`` as a proto; a file that is missing, truncated or not a model is a ``ModelFileError`` naming it
    (protobuf's own error says "Error parsing message" and no file)."""
    if isinstance(model, onnx.ModelProto):
        return model
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise ModelFileError(f"{path!r}: no such file" if not os.path.exists(path) else f"{path!r} is not a file",
                             path=path)
    try:
        proto = onnx.load(path, load_external_data=load_external_data)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path!r}: {exc.strerror or exc}", path=path) from exc
    except Exception as exc:  # protobuf's DecodeError, onnx's own errors on a damaged file
        raise ModelFileError(f"{path!r} is not a readable ONNX model (truncated or corrupt?): "
                             f"{type(exc).__name__}: {exc}", path=path) from exc
    if not proto.graph.node and not proto.graph.input and not proto.graph.output:
        raise ModelFileError(f"{path!r} is not an ONNX model: it holds no graph", path=path)
    return proto


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


_SENTINEL = 2 ** 63 - 1  # INT64_MAX: what open-ended slices (x[a:]) export as


def sentinel_constants(proto: onnx.ModelProto) -> List[str]:
    """Small int64 constants holding +-(2^63-1), each with the ops that use it.

    Harmless in ONNX Runtime, but some runtimes and converters overflow on them
    (int32 backends, TensorRT), and they mark a slice whose end the exporter did
    not know."""
    consumers: Dict[str, List[onnx.NodeProto]] = collections.defaultdict(list)
    for node in proto.graph.node:
        for name in node.input:
            consumers[name].append(node)
    tensors = [(t.name, t) for t in proto.graph.initializer]
    tensors += [(n.output[0], a.t) for n in proto.graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    by_value: Dict[tuple, List[str]] = collections.defaultdict(list)  # one finding per sentinel, not per constant
    for name, tensor in tensors:
        if tensor.data_type != onnx.TensorProto.INT64 or math.prod(tensor.dims) > 64:
            continue
        values = numpy_helper.to_array(tensor).ravel().tolist()
        hits = tuple(sorted({v for v in values if abs(v) >= _SENTINEL}))
        if hits:
            by_value[hits].append(name)
    return [_sentinel_line(list(hits), names, consumers) for hits, names in by_value.items()]


def _sentinel_line(hits, names: List[str], consumers) -> str:
    """One line however many constants and ops: the ops counted by type, a few named."""
    users = [n for name in names for n in consumers.get(name, [])]
    kinds = collections.Counter(n.op_type for n in users)
    counted = ", ".join(f"{op} x{k}" if k > 1 else op for op, k in kinds.most_common()) or "no op"
    shown = [repr(n.name) for n in users if n.name][:3]
    more = f" and {len(users) - len(shown)} more" if len(users) > len(shown) and shown else ""
    where = f" ({', '.join(shown)}{more})" if shown else ""
    constants = f"constant {names[0]!r}" if len(names) == 1 else f"{len(names)} constants"
    return f"int64 sentinel {hits} in {constants}, used by {counted}{where}"


def declared_dynamic(proto: onnx.ModelProto) -> Dict[str, Dict[int, str]]:
    """The dims onnx_compat's metadata says were meant to be dynamic (``{}`` without metadata)."""
    meta = {p.key: p.value for p in proto.metadata_props}
    wanted: Dict[str, Dict[int, str]] = {}
    for key in ("onnx_compat.inputs", "onnx_compat.outputs"):
        for spec in json.loads(meta.get(key, "[]")):
            wanted[spec["name"]] = {a: d for a, d in enumerate(spec["dims"]) if isinstance(d, str)}
    return wanted


def findings(proto: onnx.ModelProto, dynamic: Optional[Mapping[str, Mapping[int, str]]] = None) -> List[str]:
    """What deserves a look: deprecated auto_pad, int64 sentinels, dims static that were meant
    to be dynamic (``dynamic``: ``{io_name: {axis: dim_name}}``; default: from the metadata)."""
    out = [f"{n}: deprecated auto_pad (ONNX Runtime refuses it with dilation > 1)" for n in auto_pad_nodes(proto)]
    out += sentinel_constants(proto)
    out += static_where_dynamic(proto, dict(dynamic) if dynamic is not None else declared_dynamic(proto))
    return out


def describe(model: Union[str, os.PathLike, onnx.ModelProto],
            dynamic: Optional[Mapping[str, Mapping[int, str]]] = None) -> dict:
    """A summary of ``model``: opset, I/O, node count, op histogram, auto_pad, metadata, findings.

    ``dynamic``: ``{io_name: {axis: dim_name}}`` meant to be dynamic; a name or axis the graph does not
    have is an ``ArgumentError`` (a typo must not read as a dim the exporter dropped)."""
    proto = load(model)
    if dynamic is not None:
        _check_wanted(proto, dynamic)
    return {
        "opset": {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import},
        "ir_version": proto.ir_version,
        "inputs": [value_info(v) for v in proto.graph.input],
        "outputs": [value_info(v) for v in proto.graph.output],
        "nodes": len(proto.graph.node),
        "ops": op_histogram(proto),
        "auto_pad": auto_pad_nodes(proto),
        "metadata": {p.key: p.value for p in proto.metadata_props},
        "findings": findings(proto, dynamic),
    }


def _check_wanted(proto: onnx.ModelProto, wanted: Mapping[str, Mapping[int, str]]) -> None:
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(proto.graph.input) + list(proto.graph.output)}
    for name, axes in wanted.items():
        if name not in ranks:
            raise ArgumentError(f"dynamic: the graph has no input or output {name!r}; it has {list(ranks)}",
                                argument="dynamic", value=name)
        beyond = sorted(a for a in axes if not 0 <= a < ranks[name])
        if beyond:
            raise ArgumentError(f"dynamic: {name!r} has {ranks[name]} dims, no axis {beyond[0]}",
                                argument="dynamic", value=f"{name}:{beyond[0]}")


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
            raise ArgumentTypeError(f"metadata {key!r}: values must be strings, got {type(value).__name__}",
                                    argument="metadata", value=key)
        if key in existing:
            existing[key].value = value
        else:
            proto.metadata_props.add(key=key, value=value)
