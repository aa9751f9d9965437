"""Two ``Scorer``s the searches run over: RASR's calls to the written graphs, and the PyTorch callables.

``RasrEmulator`` reads the config fragment and the graphs' metadata as RASR
does and calls the graphs as RASR does: the encoder once at batch 1; the
initializer with the batch-1 encoder states (or nothing: the transducer);
the updater lazily, when a context that needs it is scored, for all such
contexts at once, with int32 ``[B]`` tokens, the encoder states still at
batch 1, each state the contexts' ``[1, ...]`` values concatenated on axis 0
and the outputs sliced back; the scorer on the same batch, with one encoder
frame ``[1, E]`` where the type feeds one; ``history`` int32 ``[B, H]``. With
``rows`` it also scores each context of a batch alone and compares the row.
``TorchCallables`` runs the same steps on the user's callables in their own
layout (states stacked on their batch axis, encoder frames repeated to the
batch), so the only difference left is the graphs.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
import torch

from onnx_compat.parts.part import batch_axis
from onnx_compat.runtimes.compare import closeness

from .config import graph_settings, setting
from .errors import LabelScorerError
from .rasr_specs import STATEFUL, graphs_of, selector


class Context:
    """A scoring context: its label history and its states (``None`` until the lazy update ran)."""

    __slots__ = ("token", "parent", "states")

    def __init__(self, states: Any = None, token: Optional[int] = None, parent: "Context" = None):
        self.states, self.token, self.parent = states, token, parent


class Scorer:
    """The lazy update and the batching RASR does, over ``_initial``, ``_update`` and ``_score``."""

    def __init__(self, kind: str, history: int = 1, start_label: int = 0):
        self.kind, self.history, self.start_label = kind, history, start_label
        self.calls = {"update": 0, "score": 0}

    def root(self) -> Context:
        if self.kind == "fixed-context":
            return Context(states=(self.start_label,) * self.history)
        return Context(states=self._initial() if self.kind in STATEFUL else ())

    def extend(self, ctx: Context, label: int) -> Context:
        if self.kind == "fixed-context":
            return Context(states=ctx.states[1:] + (label,))
        if self.kind == "ctc":
            return ctx
        return Context(token=label, parent=ctx)

    def score(self, contexts: Sequence[Context], t: int) -> np.ndarray:
        pending = list({id(c): c for c in contexts if c.states is None}.values())
        if pending:
            self.calls["update"] += 1
            for ctx, states in zip(pending, self._update([c.token for c in pending], [c.parent.states for c in pending])):
                ctx.states = states
        self.calls["score"] += 1
        if self.kind == "ctc":  # no-context-onnx runs once per context, no batching
            return np.concatenate([self._score([c.states], t) for c in contexts])
        return self._score([c.states for c in contexts], t)


class RasrEmulator(Scorer):
    def __init__(self, kind: str, values: Mapping[str, str], graphs: Optional[Mapping[str, onnx.ModelProto]] = None,
                 rows: bool = True, atol: float = 1e-5):
        super().__init__(kind, int(setting(values, "history-length", "1")), int(setting(values, "start-label-index", "0")))
        from onnx_compat.runtimes.session import open_session
        self.graphs, self.maps, self.meta = {}, {}, {}
        for graph in graphs_of(kind):
            settings = graph_settings(values, selector(kind, graph))
            # the graphs about to be written, else the files the fragment names
            proto = graphs[graph] if graphs is not None else onnx.load(settings["file"])
            self.graphs[graph] = open_session(proto)
            self.maps[graph] = settings["io-map"]
            names = {v.name for v in list(proto.graph.input) + list(proto.graph.output)}
            self.meta[graph] = {p.key: p.value for p in proto.metadata_props if p.key in names}
        self.rows, self.atol, self.row_error, self.rows_checked = rows, atol, 0.0, 0

    def encode(self, features: np.ndarray) -> int:
        m = self.maps["encoder"]
        feeds = {m["features"]: features.astype(np.float32)}
        if "features-size" in m:
            feeds[m["features-size"]] = np.array([features.shape[1]], np.int32)
        out = dict(zip([o.name for o in self.graphs["encoder"].get_outputs()], self.graphs["encoder"].run(None, feeds)))
        self.enc = out[m["outputs"]]
        return self.enc.shape[1]

    def _run(self, graph: str, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        sess = self.graphs[graph]
        return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))

    def _encoder_feeds(self, graph: str) -> Dict[str, np.ndarray]:
        m = self.maps[graph]
        feeds = {m["encoder-states"]: self.enc} if "encoder-states" in m else {}
        if "encoder-states-size" in m:
            feeds[m["encoder-states-size"]] = np.array([self.enc.shape[1]], np.int32)
        return feeds

    def _state_inputs(self, graph: str, states: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        names = {i.name for i in self.graphs[graph].get_inputs()}
        return {name: _concat(graph, name, [s[state] for s in states])
                for name, state in self.meta[graph].items() if name in names}

    def _state_outputs(self, graph: str, out: Dict[str, np.ndarray], batch: int, parents=None):
        produced = {state: out[name] for name, state in self.meta[graph].items() if name in out}
        return [{**(parents[b] if parents else {}), **{s: v[b:b + 1] for s, v in produced.items()}}
                for b in range(batch)]

    def _initial(self):
        out = self._run("state-initializer", self._encoder_feeds("state-initializer"))
        return self._state_outputs("state-initializer", out, 1)[0]

    def _update(self, tokens: List[int], parents: List[Dict[str, np.ndarray]]):
        feeds = {**self._encoder_feeds("state-updater"), **self._state_inputs("state-updater", parents)}
        if "token" in self.maps["state-updater"]:
            feeds[self.maps["state-updater"]["token"]] = np.array(tokens, np.int32)
        out = self._run("state-updater", feeds)
        self._check_rows("state-updater", feeds, out, len(tokens))
        return self._state_outputs("state-updater", out, len(tokens), parents)

    def _score(self, states, t: int) -> np.ndarray:
        m = self.maps["scorer"]
        feeds = self._state_inputs("scorer", states) if self.kind in STATEFUL else {}
        if "input-feature" in m:
            feeds[m["input-feature"]] = self.enc[0, t][None]
        if self.kind == "fixed-context":
            feeds[m["history"]] = np.array(states, np.int32).reshape(len(states), -1)
        out = self._run("scorer", feeds)
        self._check_rows("scorer", feeds, out, len(states))
        return out[m["scores"]]

    def _check_rows(self, graph: str, feeds: Dict[str, np.ndarray], out: Dict[str, np.ndarray], batch: int) -> None:
        """Each context's row of a batched run equals its run alone (inputs at batch 1 stay as they are)."""
        if not self.rows or batch < 2:
            return
        batched = {i.name for i in self.graphs[graph].get_inputs() if i.shape and not isinstance(i.shape[0], int)}
        self.rows_checked += batch
        for b in range(batch):
            alone = self._run(graph, {k: v[b:b + 1] if k in batched and v.shape[0] == batch else v
                                      for k, v in feeds.items()})
            for name, value in alone.items():
                if out[name].shape[:1] != (batch,):
                    continue
                close = closeness(out[name][b:b + 1], value, self.atol, 0.0)
                self.row_error = max(self.row_error, close.max_abs_err)
                if not close.ok:
                    raise LabelScorerError(f"graph {graph!r}: output {name!r} row {b} of a batch of {batch} differs "
                                           f"from that context scored alone by {close.max_abs_err:.3g}: hypotheses leak into "
                                           "each other", graph=graph, tensor=name, rule="rows independent")


class TorchCallables(Scorer):
    """The same search steps on the user's callables (``fns``: ``encoder``, ``initial``, ``update``, ``score``)."""

    def __init__(self, kind: str, fns: Mapping[str, Any], states: Sequence, updater_states: Sequence[str],
                 scorer_states: Sequence[str], batch: str, negate: bool, uses_length: Mapping[str, bool],
                 history: int = 1, start_label: int = 0):
        super().__init__(kind, history, start_label)
        self.fns, self.negate, self.uses_length = fns, negate, uses_length
        self.states = list(states)
        self.axes = {s.name: batch_axis(s, batch) for s in self.states}
        self.updater_states, self.scorer_states = list(updater_states), list(scorer_states)

    @torch.no_grad()
    def encode(self, features: np.ndarray) -> int:
        x = torch.from_numpy(features.astype(np.float32))
        enc, _ = self.fns["encoder"](x, torch.tensor([x.shape[1]], dtype=torch.int32))
        self.enc, self.enc_len = enc, torch.tensor([enc.shape[1]], dtype=torch.int32)
        return enc.shape[1]

    def _encoder_args(self, batch: int, graph: str) -> list:
        args = [self.enc.expand(batch, -1, -1)]
        return args + [self.enc_len.expand(batch)] if self.uses_length.get(graph, True) else args

    def _split(self, values, batch: int) -> List[Dict[str, torch.Tensor]]:
        named = dict(zip([s.name for s in self.states], values))
        return [{n: v.narrow(self.axes[n], b, 1) for n, v in named.items()} for b in range(batch)]

    def _stack(self, states: Sequence[Dict[str, torch.Tensor]], names: Sequence[str]) -> List[torch.Tensor]:
        return [torch.cat([s[n] for s in states], dim=self.axes[n]) for n in names]

    @torch.no_grad()
    def _initial(self):
        args = self._encoder_args(1, "state-initializer") if self.kind == "stateful" else []
        return self._split(_tensors(self.fns["initial"](*args)), 1)[0]

    @torch.no_grad()
    def _update(self, tokens: List[int], parents):
        token = torch.tensor(tokens, dtype=torch.long)
        args = [token] + (self._encoder_args(len(tokens), "state-updater") if self.kind == "stateful" else [])
        return self._split(_tensors(self.fns["update"](*args, *self._stack(parents, self.updater_states))), len(tokens))

    @torch.no_grad()
    def _score(self, states, t: int) -> np.ndarray:
        batch = len(states)
        frame = self.enc[:, t].expand(batch, -1) if self.kind != "stateful" else None
        if self.kind in STATEFUL:
            args = ([frame] if frame is not None else []) + self._stack(states, self.scorer_states)
        elif self.kind == "fixed-context":
            args = [frame, torch.tensor(states, dtype=torch.long).reshape(batch, -1)]
        else:
            args = [frame]
        scores = self.fns["score"](*args)
        return (-scores if self.negate else scores).float().numpy()


def _concat(graph: str, name: str, values: Sequence[np.ndarray]) -> np.ndarray:
    """RASR's ``Value::concat`` on axis 0: it ``require``s the same rank, dtype and non-axis dims of every
    hypothesis's state (a state sized by something that differs between hypotheses aborts the search)."""
    first = values[0]
    for value in values[1:]:
        if value.dtype != first.dtype or value.shape[1:] != first.shape[1:]:
            raise LabelScorerError(f"graph {graph!r}: state input {name!r} is {value.dtype} {list(value.shape)} for "
                                   f"one hypothesis and {first.dtype} {list(first.shape)} for another: RASR's "
                                   "Value::concat requires equal non-batch dims and aborts", graph=graph,
                                   tensor=name, rule="state non-batch dims static")
    return np.concatenate(values, axis=0)


def _tensors(value) -> List[torch.Tensor]:
    from onnx_compat.pipeline.adapter import flatten
    return flatten(value)
