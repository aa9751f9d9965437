"""``state-managed-onnx`` called as RASR calls it: contexts, caches, the managers' merge and split, one run.

``ManagedScorer`` is ``StateManagedOnnxLabelScorer`` (master ``8fe741b1``) over a ``run`` function: the
root context holds the manager's first state; ``start-labels`` are each a context scored at once (deferred
when an encoder input is mapped: the search enters the segment before the features); scoring a context runs
the graph on its last label (``token [B, 1]``, ``token-length`` 1) and its parent's states (the transformer:
every ancestor's, left-padded to the batch's longest prefix), caches its scores and its one-position state
by label sequence, and (lstm) drops its parent. With ``rasr_quirks`` a context whose state is set is run
again, as RASR's ``getScoreAccessors`` does, so the undefined behaviour of a dropped parent is met here,
as an error, rather than in a recognition run. With ``rows`` every batched run is compared row by row
with each hypothesis scored alone (its own prefix, no padding): a graph that does not mask the left
padding of a shorter prefix fails.

The same class runs the eager wrapper module (``EagerRun``) and the ONNX Runtime session (``SessionRun``),
so the two decodes differ only where the graphs do.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from onnx_compat.runtimes.compare import closeness

from .errors import LabelScorerError
from .managers import UNDEFINED_START


class Ctx:
    __slots__ = ("labels", "parent", "state")

    def __init__(self, labels: tuple, parent: Optional["Ctx"] = None, state=None) -> None:
        self.labels, self.parent, self.state = labels, parent, state


class ManagedScorer:
    """The label scorer over ``run(tokens, prefix_lengths, states) -> (scores [B, V], state outputs)``."""

    def __init__(self, mgr, run: Callable, start_labels: Sequence[int], deferred: bool, rasr_quirks: bool = True,
                 rows: bool = False, atol: float = 1e-5) -> None:
        self.mgr, self.run, self.start_labels, self.deferred = mgr, run, tuple(start_labels), deferred
        self.quirks, self.rows, self.atol = rasr_quirks, rows, atol
        self.scores: Dict[tuple, np.ndarray] = {}
        self.states: Dict[tuple, list] = {}
        self.row_error, self.rows_checked, self.mixed_batches, self.runs = 0.0, 0, 0, 0

    def reset(self) -> None:
        self.scores.clear()
        self.states.clear()

    def root(self) -> Ctx:
        ctx = Ctx((), None, self.mgr.initial())
        for label in self.start_labels:
            ctx = Ctx(ctx.labels + (label,), ctx)
            if not self.deferred:
                self._cache([ctx])
        return ctx

    def extend(self, ctx: Ctx, label: int) -> Ctx:
        return Ctx(ctx.labels + (label,), ctx)

    def score(self, contexts: Sequence[Ctx], t: int = 0) -> np.ndarray:
        uncached: Dict[tuple, Ctx] = {}
        for ctx in contexts:
            if ctx.state is None and ctx.labels in self.states:
                ctx.state = self.states[ctx.labels]
            elif ctx.state is None or self.quirks:  # RASR re-runs a context whose state is set
                uncached.setdefault(ctx.labels, ctx)
        if uncached:
            self._cache(list(uncached.values()))
        for ctx in contexts:  # one run per label sequence: the time-synchronous search has two alignments of one
            if ctx.state is None:  # (its children walk their parents' states)
                ctx.state = self.states[ctx.labels]
        return np.stack([self.scores[c.labels] for c in contexts])

    def _prefix(self, ctx: Ctx):
        parent = ctx.parent
        if parent is None:
            why = UNDEFINED_START if ctx.labels else ("the root context (no start-labels) has no parent: "
                                                      "cacheStatesAndScores reads parent->labelSeq (null)")
            raise LabelScorerError(f"context {list(ctx.labels)} is scored without a parent: {why}", graph="scorer",
                                   tensor="start-labels", rule="no undefined behaviour in RASR")
        n = len(parent.labels)
        if not self.mgr.all_parents:
            return n, [parent.state]
        chain = []
        for _ in range(n):
            if parent.state is None:  # RASR uncompresses parent->state.get(): a null state
                raise LabelScorerError(f"context {list(ctx.labels)}: its ancestor {list(parent.labels)} was never "
                                       "scored (a start context deferred until the encoder states arrive), so RASR "
                                       "reads a null state: undefined behaviour", graph="scorer",
                                       tensor="start-labels", rule="no undefined behaviour in RASR")
            chain.insert(0, parent.state)
            parent = parent.parent
        return n, chain

    def _cache(self, batch: List[Ctx]) -> None:
        lengths, chains = zip(*(self._prefix(c) for c in batch))
        scores, states = self._run(batch, lengths, chains)
        if self.rows and len(batch) > 1:
            self._check_rows(batch, lengths, chains, scores, states)
        for ctx, row, state in zip(batch, scores, states):
            self.scores[ctx.labels], ctx.state = row, state
            self.states[ctx.labels] = state
            if not self.mgr.all_parents:
                ctx.parent = None

    def _run(self, batch, lengths, chains):
        merged, fed = self.mgr.merge(lengths, chains)
        self.runs += 1
        scores, outputs = self.run([c.labels[-1] for c in batch], fed, merged)
        return scores, self.mgr.split(outputs, len(batch))

    def _check_rows(self, batch, lengths, chains, scores, states) -> None:
        """Each row of the batch against its hypothesis scored alone (no other prefix, so no padding)."""
        self.rows_checked += len(batch)
        self.mixed_batches += len(set(lengths)) > 1
        for b, ctx in enumerate(batch):
            alone_scores, alone_states = self._run([ctx], [lengths[b]], [chains[b]])
            pairs = [("scores", scores[b], alone_scores[0])] + [
                (f"state {i}", s, a) for i, (s, a) in enumerate(zip(states[b], alone_states[0]))]
            for what, got, want in pairs:
                close = closeness(got[None], want[None], self.atol, 0.0)
                self.row_error = max(self.row_error, close.max_abs_err)
                if not close.ok:
                    raise LabelScorerError(
                        f"{what} of hypothesis {list(ctx.labels)} (prefix {lengths[b]} in a batch of prefixes "
                        f"{list(lengths)}) differs from it scored alone by {close.max_abs_err:.3g}: the graph "
                        "reads the zeros RASR left-pads shorter prefixes with (mask the cache positions before "
                        "prefix-length), or hypotheses leak into each other", graph="scorer", tensor=what,
                        rule="rows independent of the batch's padding")


class GraphRun:
    """Feeds as RASR builds them (io-map names, int32 ``token [B, 1]``, ``token-length`` all 1, the batch-1
    encoder states), through ``call(feeds) -> {output name: array}``; reads ``scores[b, 0, :]``."""

    def __init__(self, call: Callable, io_map: Dict[str, str], variables) -> None:
        self.call, self.io_map, self.variables = call, io_map, list(variables)
        self.enc: Optional[np.ndarray] = None

    def __call__(self, tokens, prefix_lengths, merged):
        m = self.io_map
        feeds = {m["token"]: np.array(tokens, np.int32)[:, None], m["token-length"]: np.ones(len(tokens), np.int32)}
        if "prefix-length" in m:
            feeds[m["prefix-length"]] = np.array(prefix_lengths, np.int32)
        if "encoder-states" in m:
            feeds[m["encoder-states"]] = self.enc
        if "encoder-states-size" in m:
            feeds[m["encoder-states-size"]] = np.array([self.enc.shape[1]], np.int32)
        feeds.update({var.input: value for var, value in zip(self.variables, merged)})
        out = self.call(feeds)
        return out[m["scores"]][:, 0, :], [out[var.output] for var in self.variables]


def session_call(session) -> Callable:
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


def eager_call(module: torch.nn.Module, input_names: Sequence[str], output_names: Sequence[str]) -> Callable:
    """The wrapper module the graph was exported from, run in eager PyTorch with the same feeds, on one
    thread: a decode's hundreds of small steps each pay the thread pool's wake-up, 40 times the step's own
    time on a loaded 2-core machine (measured: 0.18 s against 5 ms per step)."""
    @torch.no_grad()
    def call(feeds):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = module(*[torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in input_names])
        finally:
            torch.set_num_threads(threads)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return {name: value.numpy() for name, value in zip(output_names, out)}
    return call
