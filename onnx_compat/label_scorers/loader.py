"""RASR's loader, emulated on the graphs before anything is written.

Three layers, each finding naming the graph, the tensor and the rule:

1. ``IOValidator`` per graph (strict): each required spec entry mapped; a
   mapped name is a graph input/output in the right direction; the dtype
   exactly one allowed (int64 tokens or lengths refused); the rank and
   each dim of one allowed shape (spec ``-1``: the graph dim symbolic, a
   static 1 fails; ``n``: static n; ``-2``: any).
2. The label scorer's constructor: states are the metadata keys equal to an
   I/O name; the initializer declares >= 1, the updater's and the scorer's
   are initializer states, the updater outputs >= 1, the scorer takes >= 1.
3. What RASR only assumes and crashes or decodes wrongly without: each
   state one dtype that ``Value::concat`` supports and the same static
   non-batch dims in every graph; dim 0 static 1 in the initializer and
   symbolic elsewhere; every graph input fed (a mapped entry or a state);
   the transducer initializer without inputs; the scores' width the
   vocabulary's size; the updater's encoder inputs mapped to the same
   names as the initializer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import onnx

from onnx_compat.graph import value_info

from .config import graph_settings
from .errors import LabelScorerError
from .rasr_specs import CONCATENABLE, STATEFUL, graphs_of, selector, spec_of


@dataclass(frozen=True)
class Finding:
    graph: str
    tensor: Optional[str]
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.graph}: {self.tensor or '-'}: {self.message} [{self.rule}]"


def _io(proto: onnx.ModelProto):
    return ({v.name: value_info(v) for v in proto.graph.input}, {v.name: value_info(v) for v in proto.graph.output})


def _shape_fits(dims, allowed) -> bool:
    if len(dims) != len(allowed):
        return False
    for dim, want in zip(dims, allowed):
        symbolic = not isinstance(dim, int)
        if want == -1 and not symbolic:
            return False
        if want > 0 and (symbolic or dim != want):
            return False
    return True


def validator(graph: str, proto: onnx.ModelProto, io_map: Mapping[str, str], spec) -> List[Finding]:
    """RASR's ``IOValidator::validate`` with ``validator.strict = true``."""
    inputs, outputs = _io(proto)
    found = []
    for entry in spec:
        name = io_map.get(entry.key)
        if not name:
            if not entry.optional:
                found.append(Finding(graph, entry.key, "required entry mapped",
                                     f"required {entry.direction}put '{entry.key}' is missing from io-map"))
            continue
        values = inputs if entry.direction == "in" else outputs
        if name not in values:
            found.append(Finding(graph, name, "mapped name exists", f"io-map.{entry.key} = {name!r} is not a graph "
                                 f"{entry.direction}put (it has {sorted(values)})"))
            continue
        info = values[name]
        if info["dtype"] not in entry.dtypes:
            found.append(Finding(graph, name, "dtype exactly as specified", f"io-map.{entry.key}: {name!r} is "
                                 f"{info['dtype']}, RASR accepts {'/'.join(entry.dtypes)} only"))
        if not any(_shape_fits(info["dims"], shape) for shape in entry.shapes):
            shown = " or ".join("[" + ", ".join({-1: "sym", -2: "*"}.get(d, str(d)) for d in s) + "]"
                                for s in entry.shapes)
            found.append(Finding(graph, name, "rank and dims as specified", f"io-map.{entry.key}: {name!r} has dims "
                                 f"{info['dims']}, RASR accepts {shown} (sym: a symbolic dim; a static 1 fails)"))
    return found


def _states(proto: onnx.ModelProto) -> Dict[str, Dict[str, str]]:
    """RASR's reading of the metadata: ``{"in": {io name: state}, "out": {...}}`` for keys equal to I/O names."""
    inputs, outputs = _io(proto)
    meta = {p.key: p.value for p in proto.metadata_props}
    return {"in": {k: v for k, v in meta.items() if k in inputs}, "out": {k: v for k, v in meta.items() if k in outputs}}


def constructor(graphs: Mapping[str, onnx.ModelProto]) -> List[Finding]:
    """The state rules of ``StatefulOnnxLabelScorer``'s (and the transducer's) constructor."""
    found = []
    init = _states(graphs["state-initializer"])["out"]
    if not init:
        found.append(Finding("state-initializer", None, "initializer declares >= 1 state",
                             "State initializer does not define any hidden states (no metadata key is an output)"))
    known = set(init.values())
    upd = _states(graphs["state-updater"])
    for direction in ("in", "out"):
        for name, state in upd[direction].items():
            if state not in known:
                found.append(Finding("state-updater", name, "updater states are initializer states",
                                     f"state {state!r} ({direction}put {name!r}) is not an initializer state {sorted(known)}"))
    if not upd["out"]:
        found.append(Finding("state-updater", None, "updater outputs >= 1 state", "the updater updates no state"))
    scorer = _states(graphs["scorer"])["in"]
    if not scorer:
        found.append(Finding("scorer", None, "scorer takes >= 1 state", "Scorer does not take any input state"))
    for name, state in scorer.items():
        if state not in known:
            found.append(Finding("scorer", name, "scorer states are initializer states",
                                 f"state {state!r} is not an initializer state {sorted(known)}"))
    return found


def assumed(kind: str, graphs: Mapping[str, onnx.ModelProto], maps: Mapping[str, Mapping[str, str]],
            vocabulary: int) -> List[Finding]:
    """What RASR assumes without checking."""
    found = []
    for graph, proto in graphs.items():
        inputs, _ = _io(proto)
        fed = set(maps[graph].values()) | (set(_states(proto)["in"]) if kind in STATEFUL and graph != "encoder" else set())
        found += [Finding(graph, name, "every input fed", f"input {name!r} is neither mapped in io-map nor a state: "
                          "RASR never feeds it and the run fails (a warning, then a crash)") for name in inputs if name not in fed]
    scores = _io(graphs["scorer"])[1].get(maps["scorer"].get("scores", ""))
    if scores is not None and len(scores["dims"]) == 2 and scores["dims"][1] != vocabulary:
        found.append(Finding("scorer", scores["name"], "scores as wide as the vocabulary", f"scores have "
                             f"{scores['dims'][1]} columns, the vocabulary {vocabulary} labels"))
    if kind in STATEFUL:
        found += _assumed_states(kind, graphs, maps)
    return found


def state_rules(graph: str, proto: onnx.ModelProto, frames: Optional[str] = None) -> List[Finding]:
    """What RASR assumes of each state one graph holds: a dtype ``Value::concat`` takes, the hypothesis batch
    first (static 1 in the initializer, symbolic elsewhere), the other dims static or ``frames``, the symbol of
    the encoder frames: every hypothesis of one utterance has the same frames, so the concat on axis 0 holds
    (i6's accumulated attention weights ``[hyps, T', 1]``)."""
    found = []
    inputs, outputs = _io(proto)
    for direction, names in (("in", inputs), ("out", outputs)):
        for name, state in _states(proto)[direction].items():
            info = names[name]
            dims = info["dims"]
            if info["dtype"] not in CONCATENABLE:
                found.append(Finding(graph, name, "state dtype concatenable", f"state {state!r} is "
                                     f"{info['dtype']}; RASR's Value::concat supports {', '.join(CONCATENABLE)}"))
            if not dims or not (dims[0] == 1 if graph == "state-initializer" else not isinstance(dims[0], int)):
                want = "static 1" if graph == "state-initializer" else "a symbolic batch"
                found.append(Finding(graph, name, "state batch first", f"state {state!r} dim 0 is "
                                     f"{dims[0] if dims else 'missing'}, must be {want}: RASR stacks "
                                     "hypotheses' states on axis 0"))
            if any(not isinstance(d, int) and (frames is None or d != frames) for d in dims[1:]):
                found.append(Finding(graph, name, "state non-batch dims static", f"state {state!r} has dims "
                                     f"{dims}: a symbolic non-batch dim other than the encoder frames "
                                     f"({frames or 'none here'}: a state that grows with the label history) "
                                     "cannot be stacked across hypotheses"))
    return found


def _assumed_states(kind: str, graphs, maps) -> List[Finding]:
    found, seen = [], {}
    if kind == "transducer" and len(graphs["state-initializer"].graph.input):
        found.append(Finding("state-initializer", graphs["state-initializer"].graph.input[0].name,
                             "transducer initializer without inputs", "RASR runs the transducer's initializer "
                             "with no inputs"))
    frames = frames_symbol(kind, graphs, maps)
    for graph in ("state-initializer", "state-updater", "scorer"):
        found += state_rules(graph, graphs[graph], frames)
        inputs, outputs = _io(graphs[graph])
        for direction, names in (("in", inputs), ("out", outputs)):
            for name, state in _states(graphs[graph])[direction].items():
                info = names[name]
                rest = (info["dtype"], tuple(info["dims"][1:]))
                first = seen.setdefault(state, (graph, name, rest))
                if first[2] != rest:
                    found.append(Finding(graph, name, "state alike in every graph", f"state {state!r} is "
                                         f"{rest[0]} {list(rest[1])} after the batch here, {first[2][0]} "
                                         f"{list(first[2][1])} in {first[0]!r} ({first[1]!r})"))
    if kind == "stateful":
        for key in ("encoder-states", "encoder-states-size"):
            a, b = maps["state-initializer"].get(key), maps["state-updater"].get(key)
            if a and b and a != b:
                found.append(Finding("state-updater", b, "encoder inputs named as in the initializer",
                                     f"io-map.{key} is {b!r} here, {a!r} in the initializer"))
    return found


def frames_symbol(kind: str, graphs: Mapping[str, onnx.ModelProto], maps) -> Optional[str]:
    """The symbol of the encoder frames: dim 1 of the initializer's ``encoder-states`` (stateful-onnx only; the
    transducer's initializer gets no encoder states), when symbolic."""
    name = maps.get("state-initializer", {}).get("encoder-states") if kind == "stateful" else None
    info = _io(graphs["state-initializer"])[0].get(name) if name else None
    dim = info["dims"][1] if info and len(info["dims"]) == 3 else None
    return dim if isinstance(dim, str) and dim else None


def emulate(kind: str, graphs: Mapping[str, onnx.ModelProto], values: Mapping[str, str],
            vocabulary: int) -> List[Finding]:
    """Every finding of the three layers, in order; ``values``: the parsed config fragment."""
    maps = {g: graph_settings(values, selector(kind, g))["io-map"] for g in graphs_of(kind)}
    found = []
    for graph in graphs_of(kind):
        found += validator(graph, graphs[graph], maps[graph], spec_of(kind, graph))
    if kind in STATEFUL:
        found += constructor(graphs)
    return found + assumed(kind, graphs, maps, vocabulary)


def check(kind: str, graphs: Mapping[str, onnx.ModelProto], values: Mapping[str, str], vocabulary: int) -> List[str]:
    """``emulate``, raising one ``LabelScorerError`` (the first finding's fields, every finding in the text)."""
    found = emulate(kind, graphs, values, vocabulary)
    if found:
        first = found[0]
        raise LabelScorerError("RASR's loader would refuse these graphs (or crash on them): " +
                               "; ".join(str(f) for f in found), graph=first.graph, tensor=first.tensor, rule=first.rule)
    return sorted({f"{g}: validator, " + ("constructor state rules, " if kind in STATEFUL and g != "encoder" else "")
                   + "assumed rules" for g in graphs_of(kind)})
