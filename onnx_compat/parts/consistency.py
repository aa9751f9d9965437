"""Every state the same in every graph that holds it: one dtype, the same dims.

A decoder hands the state one graph returns to the next graph's input, and
stacks hypotheses' states on the batch axis. A state that is ``[1, 2, 16]``
in one graph and ``[B, 16, 2]`` in another, or float in one and double in
the next, fails only at run time, deep in the decoder. This compares the
written graphs' declared I/O, state by state.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import onnx

from ..graph import value_info
from .errors import GraphContractError
from .part import Part


def state_views(protos: Mapping[str, onnx.ModelProto], parts: Mapping[str, Part]) -> Dict[str, List[dict]]:
    """``{state: [{"graph", "tensor", "dtype", "dims"}, ...]}`` over every graph's state I/O."""
    views: Dict[str, List[dict]] = {}
    for name, proto in protos.items():
        values = {v.name: value_info(v) for v in list(proto.graph.input) + list(proto.graph.output)}
        for io_name, state in parts[name].state_io().items():
            if io_name not in values:
                raise GraphContractError(f"graph {name!r} has no I/O {io_name!r} for state {state!r}", graph=name,
                                         tensor=io_name, rule="every declared state in the graph")
            info = values[io_name]
            views.setdefault(state, []).append({"graph": name, "tensor": io_name, "dtype": info["dtype"],
                                                "dims": info["dims"]})
    return views


def check_states_agree(protos: Mapping[str, onnx.ModelProto], parts: Mapping[str, Part], batch_first: bool,
                       shared: Sequence[str] = ()) -> Dict[str, List[dict]]:
    """dtype, rank and the non-batch dims identical (static, or a ``shared`` symbol) in every graph; batch axis 0
    when batch-first."""
    views = state_views(protos, parts)
    for state, seen in views.items():
        first = seen[0]
        for view in seen:
            where = f"state {state!r}: graph {view['graph']!r} tensor {view['tensor']!r}"
            if view["dtype"] != first["dtype"]:
                raise GraphContractError(f"{where} is {view['dtype']}, but {first['graph']!r} has it as "
                                         f"{first['dtype']}", graph=view["graph"], tensor=view["tensor"],
                                         rule="one dtype per state in every graph")
            if len(view["dims"]) != len(first["dims"]):
                raise GraphContractError(f"{where} has rank {len(view['dims'])}, {first['graph']!r} has "
                                         f"{len(first['dims'])}", graph=view["graph"], tensor=view["tensor"],
                                         rule="one rank per state in every graph")
            rest = view["dims"][1:] if batch_first else view["dims"]
            want = first["dims"][1:] if batch_first else first["dims"]
            for axis, (got, expected) in enumerate(zip(rest, want), start=1 if batch_first else 0):
                if batch_first and not isinstance(got, int) and got not in shared:
                    raise GraphContractError(f"{where} dim {axis} is {got!r}, not a static size: hypotheses' "
                                             "states stacked on the batch axis need equal other dims",
                                             graph=view["graph"], tensor=view["tensor"], rule="non-batch dims static")
                if got != expected and batch_first:
                    raise GraphContractError(f"{where} dim {axis} is {got}, but {first['graph']!r} has {expected}",
                                             graph=view["graph"], tensor=view["tensor"],
                                             rule="non-batch dims identical in every graph")
    return views
