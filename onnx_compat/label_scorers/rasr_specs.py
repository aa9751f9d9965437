"""RASR's label scorers as data: which graphs each type loads, its I/O spec, and the config keys.

Read from RASR's sources (``../shared/reference/rasr_label_scorers.md``): master
``8fe741b1`` (``stateful-onnx``, ``fixed-context-onnx``, ``no-context-onnx``,
the ``onnx`` encoder) and the open PR #149 as on ``berger_dev`` ``c44ad3e7``
(``stateful-transducer-onnx``). A spec shape's ``-1`` is a dim that must be
symbolic in the graph, ``-2`` any dim, a positive number that static size
(``IOValidator``). Names come only from ``io-map``: there are no defaults.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

F32, I32 = "float", "int32"


@dataclass(frozen=True)
class Entry:
    """One spec entry of a graph: RASR's name, direction, optional, allowed dtypes, allowed shapes."""

    key: str
    direction: str  # "in" or "out"
    optional: bool
    dtypes: Tuple[str, ...]
    shapes: Tuple[Tuple[int, ...], ...]


ENCODER = (Entry("features", "in", False, (F32,), ((-1, -1, -2), (1, -1, -2))),
           Entry("features-size", "in", True, (I32,), ((-1,), (1,))),
           Entry("outputs", "out", False, (F32,), ((-1, -1, -2), (1, -1, -2))))

_ENC_STATES = (Entry("encoder-states", "in", True, (F32,), ((1, -1, -2), (-1, -1, -2))),
               Entry("encoder-states-size", "in", True, (I32,), ((1,), (-1,))))

# per scorer kind: RASR type, {graph: (selector under decoder., spec)}
KINDS: Dict[str, dict] = {
    "stateful": {"type": "stateful-onnx", "release": "master", "graphs": {
        "state-initializer": ("state-initializer-model", _ENC_STATES),
        "state-updater": ("state-updater-model", _ENC_STATES + (Entry("token", "in", True, (I32,), ((1,), (-1,))),)),
        "scorer": ("scorer-model", (Entry("scores", "out", False, (F32,), ((-1, -2),)),))}},
    "transducer": {"type": "stateful-transducer-onnx", "release": "transducer-pr", "graphs": {
        "state-initializer": ("state-initializer-model", ()),
        "state-updater": ("state-updater-model", (Entry("token", "in", False, (I32,), ((1,), (-1,))),)),
        "scorer": ("scorer-model", (Entry("input-feature", "in", False, (F32,), ((-1, -2), (1, -2))),
                                    Entry("scores", "out", False, (F32,), ((-1, -2),))))}},
    "fixed-context": {"type": "fixed-context-onnx", "release": "master", "graphs": {
        "scorer": ("onnx-model", (Entry("input-feature", "in", False, (F32,), ((-1, -2), (1, -2))),
                                  Entry("history", "in", False, (I32,), ((-1, -2),)),
                                  Entry("scores", "out", False, (F32,), ((-1, -2),))))}},
    "ctc": {"type": "no-context-onnx", "release": "master", "graphs": {
        "scorer": ("onnx-model", (Entry("input-feature", "in", False, (F32,), ((-1, -2), (1, -2))),
                                  Entry("scores", "out", False, (F32,), ((-1, -2), (1, -2)))))}},
}

RELEASES = {"master": "RASR master (8fe741b1)",
            "transducer-pr": "RASR with the open transducer PR #149 (berger_dev c44ad3e7)"}

# the element types Onnx::Value::concat supports: a state of another type cannot be batched
CONCATENABLE = ("float", "double", "int64", "uint64", "int32", "uint32", "int16", "uint16", "int8")

STATEFUL = ("stateful", "transducer")


def graphs_of(kind: str) -> Sequence[str]:
    """The files a folder holds for ``kind``: the encoder, then the decoder's graphs."""
    return ("encoder",) + tuple(KINDS[kind]["graphs"])


def selector(kind: str, graph: str) -> str:
    """The graph's config selector under ``label-scorer``."""
    if graph == "encoder":
        return "encoder.onnx-model"
    return "decoder." + KINDS[kind]["graphs"][graph][0]


def spec_of(kind: str, graph: str) -> Sequence[Entry]:
    return ENCODER if graph == "encoder" else KINDS[kind]["graphs"][graph][1]
