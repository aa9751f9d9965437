"""The streaming contract a runtime reads from ``metadata_props`` (see docs/streaming.md).

Keys, all strings:

- ``streaming.chunk_size``: frames of the streamed inputs per call (the
  right context included); ``streaming.chunk_shift``: frames the stream
  advances per call; ``streaming.right_context``: lookahead frames
  (``chunk_size - chunk_shift`` unless declared); ``streaming.time_axis``.
- ``streaming.states``: a JSON list, one object per state in ONNX input order:
  ``name`` (graph input), ``output`` (graph output carrying its next value),
  ``path`` (its place in the step's nested arguments), ``dims`` (ints and
  dim names; a named dim other than the batch grows from 0), ``dtype``,
  ``shape_batch1`` (the initial shape at batch 1), ``grows`` (the dim
  that grows by the chunk on every call, when one does) and ``init``: ``"zeros"``,
  ``"constant:<v>"``, ``"empty"`` (a growing cache, size 0) or ``"custom"``
  (made by a Python function: the runtime must be told the values).
- ``STATE_<input>`` = ``<output>`` for each state (RASR's convention).
"""
from __future__ import annotations

import json
from typing import Dict, List, Mapping

import torch

from .states import StateLayout


def init_kind(value: torch.Tensor) -> str:
    if value.numel() == 0:
        return "empty"
    if not bool((value == value.reshape(-1)[0]).all()):
        return "custom"
    first = value.reshape(-1)[0].item()
    return "zeros" if first == 0 else f"constant:{first}"


def describe_states(layout: StateLayout, initial_batch1: List[torch.Tensor], grown: Mapping[str, str]) -> List[dict]:
    return [{**spec.describe(), "path": path, "shape_batch1": list(init.shape), "init": init_kind(init),
             **({"grows": grown[spec.name]} if spec.name in grown else {})}
            for spec, path, init in zip(layout.flat, layout.paths, initial_batch1)]


def streaming_metadata(layout: StateLayout, initial_batch1: List[torch.Tensor], chunk: int, shift: int,
                       right_context: int, time_axis: int, step: str, grown: Mapping[str, str],
                       user: Mapping[str, str] = ()) -> Dict[str, str]:
    entries = {
        "streaming.step": step,
        "streaming.chunk_size": str(chunk),
        "streaming.chunk_shift": str(shift),
        "streaming.right_context": str(right_context),
        "streaming.time_axis": str(time_axis),
        "streaming.states": json.dumps(describe_states(layout, initial_batch1, grown)),
    }
    entries.update({f"STATE_{spec.name}": spec.output for spec in layout.flat})
    entries.update(dict(user or {}))
    return entries
