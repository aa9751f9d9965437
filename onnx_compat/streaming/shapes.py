"""Fixed state sizes written into the graph's output shapes.

A cache sliced to its last ``left`` frames (``keys[:, keys.shape[1] - left:]``)
comes out of the TorchScript exporter with a symbolic size
(``Concatnew_cache_k_dim_2``), though it is ``left`` on every call. A runtime
that allocates its state buffers from the graph's shapes needs the number: a
declared int dim that the graph left symbolic is written in, and the stream
verification then runs on the graph with those shapes.
"""
from __future__ import annotations

from typing import List

import onnx

from .states import StateLayout


def stamp_state_dims(proto: onnx.ModelProto, layout: StateLayout) -> List[str]:
    """Write each declared int dim of a state output over a symbolic one; returns what changed."""
    outputs = {o.name: o for o in proto.graph.output}
    changed = []
    for spec in layout.flat:
        value = outputs.get(spec.output)
        if value is None or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        for axis, (dim, declared) in enumerate(zip(dims, spec.dims)):
            if isinstance(declared, int) and not dim.HasField("dim_value"):
                was = dim.dim_param or "?"
                dim.Clear()
                dim.dim_value = declared
                changed.append(f"{spec.output} dim {axis}: {was} -> {declared}")
    return changed
