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
  ``"constant:<v>"``, ``"empty"`` (a growing cache, size 0), ``"values"``
  (from a Python ``init_states``, small and the same for every batch item:
  ``values`` holds them at batch 1, to repeat along the batch axis) or
  ``"custom"`` (the runtime must be told the values).
- ``STATE_<input>`` = ``<output>`` for each state (RASR's convention).
"""
from __future__ import annotations

import json
from typing import Dict, List, Mapping, Optional

import torch

from .states import StateLayout


def init_kind(value: torch.Tensor) -> str:
    if value.numel() == 0:
        return "empty"
    if not bool((value == value.reshape(-1)[0]).all()):
        return "custom"
    first = value.reshape(-1)[0].item()
    return "zeros" if first == 0 else f"constant:{first}"


VALUES_LIMIT = 4096  # elements at batch 1: initial values written into the metadata up to this size


def describe_states(layout: StateLayout, initial_batch1: List[torch.Tensor], grown: Mapping[str, str],
                    initial_batch2: Optional[List[torch.Tensor]] = None, batch: Optional[str] = None) -> List[dict]:
    out = []
    for k, (spec, path, init) in enumerate(zip(layout.flat, layout.paths, initial_batch1)):
        entry = {**spec.describe(), "path": path, "shape_batch1": list(init.shape), "init": init_kind(init),
                 **({"grows": grown[spec.name]} if spec.name in grown else {})}
        if entry["init"] == "custom" and initial_batch2 is not None and _repeats(spec, init, initial_batch2[k], batch):
            entry.update(init="values", values=init.tolist())
        out.append(entry)
    return out


def _repeats(spec, first: torch.Tensor, second: torch.Tensor, batch: Optional[str]) -> bool:
    """Small, and the batch-2 values are the batch-1 values repeated along the batch axis: a runtime can tile them."""
    if first.numel() > VALUES_LIMIT:
        return False
    axis = next((i for i, d in enumerate(spec.dims) if getattr(d, "name", None) == batch), None)
    expected = first if axis is None else first.repeat_interleave(2, dim=axis)
    return expected.shape == second.shape and torch.equal(expected, second)


def streaming_metadata(layout: StateLayout, initial_batch1: List[torch.Tensor], chunk: int, shift: int,
                       right_context: int, time_axis: int, step: str, grown: Mapping[str, str],
                       user: Mapping[str, str] = (), initial_batch2: Optional[List[torch.Tensor]] = None,
                       batch: Optional[str] = None) -> Dict[str, str]:
    entries = {
        "streaming.step": step,
        "streaming.chunk_size": str(chunk),
        "streaming.chunk_shift": str(shift),
        "streaming.right_context": str(right_context),
        "streaming.time_axis": str(time_axis),
        "streaming.states": json.dumps(describe_states(layout, initial_batch1, grown, initial_batch2, batch)),
    }
    entries.update({f"STATE_{spec.name}": spec.output for spec in layout.flat})
    entries.update(dict(user or {}))
    return entries
