"""RASR's ``state-managed-onnx`` label scorer as data: its I/O spec, its two state managers, its loader's rules.

Read from RASR master ``8fe741b1``: ``src/Nn/LabelScorer/StateManagedOnnxLabelScorer.cc`` (the spec, the
calls), ``src/Nn/TransformerStateManager.hh``, ``src/Nn/LstmStateManager.hh`` and ``src/Onnx/Session.cc``
(states from the metadata ``STATE_<input name> = <output name>``, each state's shape the input's).

``Transformer`` and ``Lstm`` do with numpy what the managers do with ``Onnx::Value``: the first state of a
hypothesis (zero-length for the transformer, zeros ``[S]`` for the lstm), the merge of the hypotheses'
states into one batch (the transformer stacks every ancestor's state on the one symbolic dim, left-padded
with zeros to the longest prefix of the batch, at most ``max-history`` of them; the lstm stacks the
parents' ``[S]`` rows) and the split of the graph's outputs back into one state per hypothesis (the last
position of the time dim; the lstm's rows). ``findings`` is the loader: ``IOValidator`` with this spec,
the session's state variables, each manager's ``require``s, and what RASR assumes without checking.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from onnx_compat.graph import value_info

from .loader import Finding, validator
from .rasr_specs import ENCODER, F32, I32, Entry

RASR_TYPE, STATE_PREFIX = "state-managed-onnx", "STATE_"
MANAGERS = ("transformer", "lstm")

SPEC = (Entry("token", "in", False, (I32,), ((-1, 1), (-1, -1))),
        Entry("token-length", "in", False, (I32,), ((-1,),)),
        Entry("prefix-length", "in", True, (I32,), ((-1,),)),
        Entry("encoder-states", "in", True, (F32,), ((1, -1, -2), (-1, -1, -2))),
        Entry("encoder-states-size", "in", True, (I32,), ((1,), (-1,))),
        Entry("scores", "out", False, (F32,), ((-1, 1, -2), (-1, -1, -2))))

# StateManagedOnnxLabelScorer.cc at 8fe741b1: the lines a search without encoder inputs runs into
UNDEFINED_START = ("RASR master 8fe741b1 StateManagedOnnxLabelScorer.cc: getInitialScoringContext scores the "
                   "start-label context at once when no encoder input is mapped (cacheStatesAndScores, lines "
                   "330-332 defer it only when one is); the lstm manager then drops its parent (lines 402-404); "
                   "the search scores that context again because its state is set (lines 257-262 re-run every "
                   "context that has a state), and the re-run reads parent->labelSeq of the dropped parent "
                   "(lines 341-355): a null dereference, undefined behaviour")


class StateVariable:
    """One state as RASR's session reads it: the metadata key's input, its value's output, the input's dims."""

    __slots__ = ("input", "output", "dims")

    def __init__(self, input_name: str, output_name: str, dims: Sequence) -> None:
        self.input, self.output, self.dims = input_name, output_name, list(dims)

    @property
    def time_axis(self) -> Optional[int]:
        """The transformer manager's time axis: the last symbolic dim after the batch."""
        axes = [i for i, d in enumerate(self.dims) if i > 0 and not isinstance(d, int)]
        return axes[-1] if axes else None


def state_variables(proto: onnx.ModelProto, prefix: str = STATE_PREFIX) -> List[StateVariable]:
    """``Session::getStateVariablesMetadata``: every metadata key starting with ``prefix``."""
    inputs = {v.name: value_info(v) for v in proto.graph.input}
    out = []
    for p in proto.metadata_props:
        if p.key.startswith(prefix):
            name = p.key[len(prefix):]
            out.append(StateVariable(name, p.value, inputs[name]["dims"] if name in inputs else []))
    return out


class Transformer:
    """``TransformerStateManager<float>``: every ancestor's one-position state, stacked on the time axis."""

    name, all_parents = "transformer", True

    def __init__(self, variables: Sequence[StateVariable], max_history: Optional[int] = None) -> None:
        self.variables, self.max_history = list(variables), max_history

    def initial(self) -> List[np.ndarray]:
        return [np.zeros(0, np.float32) for _ in self.variables]

    def merge(self, prefix_lengths: Sequence[int], chains: Sequence[Sequence[List[np.ndarray]]]):
        """``[B, ..., max_prefix, ...]`` per state, row b right-aligned, zeros before; and the prefix lengths
        fed (cut to ``max-history``)."""
        kept = [min(n, self.max_history) if self.max_history is not None else n for n in prefix_lengths]
        longest = max(kept) if kept else 0
        merged = []
        for v, var in enumerate(self.variables):
            axis = var.time_axis
            shape = [len(kept)] + [longest if i == axis else d for i, d in enumerate(var.dims) if i > 0]
            tensor = np.zeros(shape, np.float32)
            for b, (n, chain) in enumerate(zip(kept, chains)):
                if n:
                    index = [b] + [slice(longest - n, longest) if i == axis else slice(None) for i in range(1, len(shape))]
                    tensor[tuple(index)] = np.concatenate([s[v] for s in chain[len(chain) - n:]], axis)[0]
            merged.append(tensor)
        return merged, kept

    def split(self, outputs: Sequence[np.ndarray], batch: int) -> List[List[np.ndarray]]:
        """Each hypothesis' state: the output's last position on the time axis (one suffix label)."""
        rows = [[] for _ in range(batch)]
        for var, out in zip(self.variables, outputs):
            _require_dims(var, out)
            last = np.take(out, [out.shape[var.time_axis] - 1], axis=var.time_axis)
            for b in range(batch):
                rows[b].append(np.array(last[b:b + 1], np.float32))
        return rows


class Lstm:
    """``LstmStateManager``: one ``[S]`` row per state, zeros first; the parent's rows stacked."""

    name, all_parents = "lstm", False

    def __init__(self, variables: Sequence[StateVariable], max_history: Optional[int] = None) -> None:
        self.variables = list(variables)

    def initial(self) -> List[np.ndarray]:
        return [np.zeros((1, var.dims[-1]), np.float32) for var in self.variables]

    def merge(self, prefix_lengths: Sequence[int], chains):
        return [np.concatenate([chain[-1][v] for chain in chains]) for v in range(len(self.variables))], \
            list(prefix_lengths)

    def split(self, outputs: Sequence[np.ndarray], batch: int) -> List[List[np.ndarray]]:
        for var, out in zip(self.variables, outputs):
            _require_dims(var, out)
        return [[np.array(out[b:b + 1], np.float32) for out in outputs] for b in range(batch)]


def _require_dims(var: StateVariable, out: np.ndarray) -> None:
    """The managers' ``require_eq``: an output's static dims at run time are the input's (else RASR aborts)."""
    if out.ndim != len(var.dims) or any(isinstance(d, int) and out.shape[i] != d
                                        for i, d in enumerate(var.dims) if i > 0):
        from .errors import LabelScorerError
        raise LabelScorerError(f"state {var.input!r}: output {var.output!r} came back {list(out.shape)}, the input "
                               f"is {var.dims}: RASR's state manager aborts (require_eq)", graph="scorer",
                               tensor=var.output, rule="state out as the state in")


def manager(name: str, variables: Sequence[StateVariable], max_history: Optional[int] = None):
    return (Transformer if name == "transformer" else Lstm)(variables, max_history)


def _io(proto: onnx.ModelProto):
    return ({v.name: value_info(v) for v in proto.graph.input}, {v.name: value_info(v) for v in proto.graph.output})


def manager_rules(graph: str, proto: onnx.ModelProto, manager_name: str) -> List[Finding]:
    """The manager's ``require``s on each state (they abort a recognition run), checked on the graph."""
    inputs, outputs = _io(proto)
    found = []
    variables = state_variables(proto)
    if not variables:
        found.append(Finding(graph, None, "at least one state", "no metadata key starts with STATE_: RASR "
                             "errors 'Initial recurrent state is empty.'"))
    for var in variables:
        if var.input not in inputs or var.output not in outputs:
            missing = var.input if var.input not in inputs else var.output
            found.append(Finding(graph, missing, "state names exist", f"metadata STATE_{var.input} = {var.output}: "
                                 f"{missing!r} is not a graph {'in' if missing == var.input else 'out'}put"))
            continue
        got_in, got_out = inputs[var.input], outputs[var.output]
        for info in (got_in, got_out):
            if info["dtype"] != F32:
                found.append(Finding(graph, info["name"], "state float32", f"state {info['name']!r} is "
                                     f"{info['dtype']}: the {manager_name} manager reads and writes float32"))
        found += _dims_rule(graph, var, got_in["dims"], got_out["dims"], manager_name)
    return found


def _dims_rule(graph: str, var: StateVariable, dims_in, dims_out, manager_name: str) -> List[Finding]:
    symbolic = [i for i, d in enumerate(dims_in) if i > 0 and not isinstance(d, int)]
    batch_ok = bool(dims_in) and not isinstance(dims_in[0], int) and bool(dims_out) and not isinstance(dims_out[0], int)
    # RASR compares the outputs' run-time sizes with the input's dims: an output dim may stay symbolic
    agree = len(dims_out) == len(dims_in) and all(
        not isinstance(a, int) or not isinstance(b, int) or a == b for i, (a, b) in enumerate(zip(dims_in, dims_out))
        if i > 0 and i not in symbolic)
    if manager_name == "lstm":
        ok = len(dims_in) == 2 and batch_ok and not symbolic and agree
        want = "[B symbolic, S static] in and out (LstmStateManager: zeros of the static S first, rank 2 out)"
    else:
        ok = len(dims_in) >= 2 and batch_ok and len(symbolic) == 1 and agree
        want = ("rank >= 2, the batch first, exactly one symbolic dim after it (the time axis RASR stacks the "
                "prefix on; a second one is fed the prefix length too), the others static and equal in and out")
    if ok:
        return []
    return [Finding(graph, var.input, f"{manager_name} manager state dims", f"state {var.input!r} -> "
                    f"{var.output!r} has dims {dims_in} in, {dims_out} out; the {manager_name} manager needs {want}")]


def findings(graphs: Mapping[str, onnx.ModelProto], maps: Mapping[str, Mapping[str, str]], settings: Mapping[str, str],
             vocabulary: int) -> List[Finding]:
    """Every finding of RASR's loading of a ``state-managed-onnx`` folder (``graphs``: ``scorer`` and, for an
    encoder-decoder, ``encoder``; ``settings``: the decoder's own keys as the fragment writes them)."""
    found = []
    if "encoder" in graphs:
        found += validator("encoder", graphs["encoder"], maps["encoder"], ENCODER)
    proto, io_map = graphs["scorer"], maps["scorer"]
    found += validator("scorer", proto, io_map, SPEC)
    name = settings.get("state-manager.type", "lstm")  # RASR's default manager
    if name not in MANAGERS:
        found.append(Finding("scorer", None, "known state manager", f"state-manager.type = {name}: this export "
                             f"writes {' or '.join(MANAGERS)}"))
        return found
    found += manager_rules("scorer", proto, name)
    fed = set(io_map.values()) | {v.input for v in state_variables(proto)}
    found += [Finding("scorer", i.name, "every input fed", f"input {i.name!r} is neither mapped in io-map nor a "
                      "STATE_ input: RASR never feeds it and the run fails (a warning, then a crash)")
              for i in proto.graph.input if i.name not in fed]
    scores = _io(proto)[1].get(io_map.get("scores", ""))
    if scores is not None and scores["dims"] and scores["dims"][-1] != vocabulary:
        found.append(Finding("scorer", scores["name"], "scores as wide as the vocabulary", f"scores have "
                             f"{scores['dims'][-1]} columns, the vocabulary {vocabulary} labels"))
    return found + start_findings(name, settings, io_map)


def start_findings(manager_name: str, settings: Mapping[str, str], io_map: Mapping[str, str]) -> List[Finding]:
    """What RASR master does with the first context: without ``start-labels`` the root context has no parent
    and scoring it dereferences a null parent; with the lstm manager and no encoder input the start context
    is scored again after its parent was dropped."""
    if not settings.get("start-labels", "").split():
        return [Finding("scorer", "start-labels", "start-labels set", "no start-labels: RASR scores the root "
                        "context, which has no parent, and cacheStatesAndScores reads parent->labelSeq (null)")]
    if manager_name == "lstm" and not ({"encoder-states", "encoder-states-size"} & set(io_map)):
        return [Finding("scorer", "state-manager.type", "lstm manager needs an encoder input", UNDEFINED_START)]
    return []


def parse_start_labels(settings: Mapping[str, str]) -> Tuple[int, ...]:
    return tuple(int(v) for v in settings.get("start-labels", "").split())


def max_history(settings: Mapping[str, str]) -> Optional[int]:
    value = settings.get("state-manager.max-history")
    return int(value) if value is not None else None


def decoder_settings(values: Mapping[str, str], prefix: str) -> Dict[str, str]:
    """The decoder's own keys (``start-labels``, ``state-manager.*``) from a parsed fragment."""
    return {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix) and ".io-map." not in k
            and not k.startswith(prefix + "onnx-model.")}
