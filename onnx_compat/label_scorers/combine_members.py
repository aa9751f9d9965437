"""One scorer of a combination as each side of its proof runs it: over its written graphs, as RASR calls them
(``managed_member``; ``CtcPrefix`` over a CTC head's), or over the PyTorch callables (``torch_member``).

Both searches use them: ``combine.py``'s label-synchronous one and ``combine_timesync.py``'s time-synchronous
one (a transducer and LMs). They live here, below both: ``combine.py`` dispatches to ``combine_timesync.py``,
so the time-synchronous proof reading them from ``combine.py`` made the two import each other.

``CtcPrefix`` is RASR master's ``CtcPrefixLabelScorer`` (``8fe741b1``) over the per-frame CTC costs: a
label's cost is the prefix extended by it minus the prefix (both ``-log`` CTC prefix probabilities), the
sentence end's the whole prefix's probability at the last frame minus the prefix's.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from . import config, managers
from .errors import LabelScorerError

FLOAT_MAX = float(np.finfo(np.float32).max)  # Core::Type<Score>::max: RASR's cost of an impossible label


def _score_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``Math::scoreSum``: ``-log(exp(-a) + exp(-b))``, infinities kept."""
    return -np.logaddexp(-a, -b)


class _Prefix:
    __slots__ = ("labels", "parent", "blank", "label", "score", "ext")

    def __init__(self, labels: tuple, parent: Optional["_Prefix"]) -> None:
        self.labels, self.parent = labels, parent
        self.blank = self.label = self.score = self.ext = None


class CtcPrefix:
    """``ctc-prefix`` over a time-synchronous CTC scorer (``inner``: ``encode``, ``root``, ``score(ctxs, t)``)."""

    def __init__(self, inner, blank: int, vocab_size: int, sentence_end: int, labels: int) -> None:
        self.inner, self.blank, self.vocab_size, self.eos, self.labels = inner, blank, vocab_size, sentence_end, labels
        self.ctc = np.zeros((vocab_size, 0))

    def encode(self, features: np.ndarray) -> int:
        """``setupCTCScores``: the CTC scorer's costs of every label at every frame, ``[V + 1, T]``."""
        frames = self.inner.encode(features)
        root = self.inner.root()
        rows = [np.asarray(self.inner.score([root], t)[0], np.float64) for t in range(frames)]
        if rows and rows[0].shape[0] != self.vocab_size:
            raise LabelScorerError(f"the CTC scorer gives {rows[0].shape[0]} costs per frame, vocab-size is "
                                   f"{self.vocab_size}", graph="scorer", tensor="scores", rule="ctc vocab-size")
        self.ctc = np.stack(rows, 1) if rows else np.zeros((self.vocab_size, 0))
        return frames

    def root(self) -> _Prefix:
        return _Prefix((), None)

    def extend(self, ctx: _Prefix, label: int) -> _Prefix:
        return _Prefix(ctx.labels + (label,), ctx)

    def score(self, contexts: Sequence[_Prefix], t: int = 0) -> np.ndarray:
        return np.stack([self._row(c) for c in contexts])

    def _finalize(self, ctx: _Prefix) -> None:
        """``finalizeScoringContext``: per frame, the prefix's cost ending in blank and ending in its label."""
        if ctx.blank is not None:
            return
        frames = self.ctc.shape[1]
        if not ctx.labels:
            ctx.score, ctx.blank, ctx.label = 0.0, np.cumsum(self.ctc[self.blank]), np.full(frames, np.inf)
            return
        parent, y = ctx.parent, ctx.labels[-1]
        self._finalize(parent)
        ctx.score = self._extended(parent)[y]
        blank, label = np.full(frames, np.inf), np.full(frames, np.inf)
        if frames and len(ctx.labels) == 1:
            label[0] = self.ctc[y, 0]
        repeat = len(ctx.labels) >= 2 and y == ctx.labels[-2]
        for t in range(1, frames):
            blank[t] = _score_sum(blank[t - 1], label[t - 1]) + self.ctc[self.blank, t]
            before = parent.blank[t - 1] if repeat else _score_sum(parent.blank[t - 1], parent.label[t - 1])
            label[t] = _score_sum(label[t - 1], before) + self.ctc[y, t]
        ctx.blank, ctx.label = blank, label

    def _extended(self, ctx: _Prefix) -> np.ndarray:
        """``extendedPrefixScore`` of every label at once: the cost of the prefix followed by each label."""
        if ctx.ext is None:
            frames = self.ctc.shape[1]
            total = np.full(self.vocab_size, np.inf)
            if frames and not ctx.labels:
                total = self.ctc[:, 0].copy()
            for t in range(1, frames):
                step = np.full(self.vocab_size, _score_sum(ctx.blank[t - 1], ctx.label[t - 1]))
                if ctx.labels:
                    step[ctx.labels[-1]] = ctx.blank[t - 1]
                total = _score_sum(total, step + self.ctc[:, t])
            ctx.ext = total
        return ctx.ext

    def _row(self, ctx: _Prefix) -> np.ndarray:
        self._finalize(ctx)
        frames = self.ctc.shape[1]
        if not frames:
            return np.full(self.labels, FLOAT_MAX)
        ext = self._extended(ctx)[:self.labels]
        row = np.where(np.isinf(ext) | math.isinf(ctx.score), FLOAT_MAX, ext - ctx.score)
        end = _score_sum(ctx.blank[-1], ctx.label[-1])
        row[self.eos] = FLOAT_MAX if math.isinf(end) or math.isinf(ctx.score) else end - ctx.score
        return row


class _Managed:
    """A state-managed scorer as a member of the combination: its encoder run on ``encode``, caches reset."""

    def __init__(self, scorer, run, encode=None) -> None:
        self.scorer, self.run, self.encode_fn = scorer, run, encode

    def encode(self, features: np.ndarray) -> int:
        self.scorer.reset()
        if self.encode_fn is None:
            return 0
        self.run.enc = self.encode_fn(features)
        return self.run.enc.shape[1]

    def root(self):
        self.scorer.reset()
        return self.scorer.root()

    def extend(self, ctx, label):
        return self.scorer.extend(ctx, label)

    def score(self, contexts, t=0):
        return self.scorer.score(contexts, t)


def managed_member(values, role):
    import onnx
    from onnx_compat.runtimes.session import open_session
    from .managed_search import GraphRun, ManagedScorer, session_call
    pre = "decoder." if role == "aed" else ""
    graph = config.graph_settings(values, pre + "onnx-model")
    proto = onnx.load(graph["file"])
    settings = managers.decoder_settings(values, pre)
    variables = managers.state_variables(proto)
    run = GraphRun(session_call(open_session(proto)), graph["io-map"], variables)
    mgr = managers.manager(settings["state-manager.type"], variables, managers.max_history(settings))
    deferred = bool({"encoder-states", "encoder-states-size"} & set(graph["io-map"]))
    encode = None
    if role == "aed":
        enc = config.graph_settings(values, "encoder.onnx-model")
        session = open_session(enc["file"])
        encode = _session_encoder(session, enc["io-map"])
    return _Managed(ManagedScorer(mgr, run, managers.parse_start_labels(settings), deferred), run, encode)


def _session_encoder(session, io_map):
    names = [o.name for o in session.get_outputs()]

    def encode(features: np.ndarray) -> np.ndarray:
        feeds = {io_map["features"]: features}
        if "features-size" in io_map:
            feeds[io_map["features-size"]] = np.array([features.shape[1]], np.int32)
        return dict(zip(names, session.run(None, feeds)))[io_map["outputs"]]
    return encode


def torch_member(job: Mapping, rep, role: str, eos: int, labels: int):
    """The same scorer over the PyTorch callables (``backends.TorchCallables``; a state-managed one through
    its wrapper module in eager mode)."""
    import torch
    from .backends import TorchCallables
    negate = job.get("scores", "log-probs") == "log-probs"
    if role == "ctc-prefix":
        inner = TorchCallables("ctc", {"encoder": job["encoder"], "score": job["score"]}, [], [], [],
                               job.get("batch", "hyps"), negate, {})
        return CtcPrefix(inner, job["blank"], len(job["vocabulary"]), eos, labels)
    if job["kind"] == "stateful":
        names = [s.name for s in job["states"]]
        fns = {"encoder": job["encoder"], "initial": job["initial"], "update": job["update"], "score": job["score"]}
        return TorchCallables("stateful", fns, job["states"], job.get("updater_states") or names,
                              job.get("scorer_states") or names, job.get("batch", "hyps"), negate,
                              rep.uses_encoder_lengths, start_label=job.get("start_label", 0))
    from .managed_search import GraphRun, ManagedScorer, eager_call
    eager = rep.eager
    run = GraphRun(eager_call(eager.module, eager.inputs, eager.outputs), _io_map(rep, role), _variables(rep))
    settings = managers.decoder_settings(config.parse(rep.config), "decoder." if role == "aed" else "")
    mgr = managers.manager(settings["state-manager.type"], _variables(rep), managers.max_history(settings))
    encode = None
    if role == "aed":
        def encode(features):
            with torch.no_grad():
                frames, _ = eager.encoder(torch.from_numpy(features), torch.tensor([features.shape[1]], dtype=torch.int32))
            return frames.numpy()
    return _Managed(ManagedScorer(mgr, run, managers.parse_start_labels(settings), role == "aed", rasr_quirks=False),
                    run, encode)


def _io_map(rep, role):
    return config.graph_settings(config.parse(rep.config), ("decoder." if role == "aed" else "") + "onnx-model")["io-map"]


def _variables(rep):
    import onnx
    return managers.state_variables(onnx.load(rep.files["scorer"]))
