"""A part with no inputs is a constant graph: its outputs computed once in PyTorch, written as Constants.

A transducer's state initializer takes nothing (RASR runs it without
inputs): its states are a function of the weights alone. ``export()`` needs
at least one input to trace, and an exporter would fold the whole graph to
these constants anyway; writing them directly gives the same graph, which
is then run in ONNX Runtime and compared with PyTorch like any other.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from onnx_compat.spec import TensorSpec

from .errors import GraphContractError

OPSET = 17


def constant_graph(name: str, values: Sequence[torch.Tensor], outputs: Sequence[TensorSpec],
                   metadata: Dict[str, str]) -> onnx.ModelProto:
    """One ``Constant`` node per output, shapes and dtypes as computed; ``outputs`` give the names."""
    nodes, infos = [], []
    for spec, value in zip(outputs, values):
        array = value.detach().cpu().contiguous().numpy()
        _check_shape(name, spec, array)
        nodes.append(helper.make_node("Constant", [], [spec.name], value=numpy_helper.from_array(array, spec.name)))
        elem = helper.np_dtype_to_tensor_dtype(array.dtype)
        infos.append(helper.make_tensor_value_info(spec.name, elem, list(array.shape)))
    graph = helper.make_graph(nodes, name, [], infos)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnx_compat")
    proto.ir_version = 8
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(proto)
    return proto


def _check_shape(name: str, spec: TensorSpec, array: np.ndarray) -> None:
    dims = [d if isinstance(d, int) else None for d in spec.dims]
    if len(dims) != array.ndim or any(d is not None and d != s for d, s in zip(dims, array.shape)):
        raise GraphContractError(f"graph {name!r}: output {spec.name!r} has shape {list(array.shape)}, declared "
                                 f"{[d if d is not None else '?' for d in dims]}", graph=name, tensor=spec.name,
                                 rule="outputs as declared")


def verify_constant(proto: onnx.ModelProto, values: List[torch.Tensor], name: str) -> List[dict]:
    """The constant graph run in ONNX Runtime gives the PyTorch values exactly."""
    from ..runtimes.session import open_session as session
    got = session(proto).run(None, {})
    for out, want, value in zip(proto.graph.output, values, got):
        if not np.array_equal(value, want.detach().cpu().numpy()):
            raise GraphContractError(f"graph {name!r}: ONNX Runtime's {out.name!r} differs from PyTorch's",
                                     graph=name, tensor=out.name, rule="graph equals PyTorch")
    return [{"sizes": {}, "ok": True, "outputs": [o.name for o in proto.graph.output]}]
