"""The user's arguments and callables checked in eager PyTorch, before any graph is exported.

Bad input is one ``LabelScorerError`` naming the culprit: an unknown kind or
release, int64 lengths, an id the kind's search does not use, a state RASR
cannot batch (no batch axis, a dtype ``Value::concat`` does not take), a
state whose returned shape is not the declared one (named by state and
dim, sizes measured), one that grows with the label history (measured: longer
after an update), a named dim that is not the encoder frames, a vocabulary
of another size than the scores, scores that are not normalized log-probs
or costs as declared (each row's log-sum-exp measured; the advice follows
from what the rows are: logits, probabilities, costs or log-probs).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from onnx_compat.parts.errors import GraphContractError
from onnx_compat.parts.part import batch_axis
from onnx_compat.spec import Dim, TensorSpec

from .errors import LabelScorerError
from .rasr_specs import KINDS, RELEASES

_NOT_CONCATENABLE = (torch.float16, torch.bfloat16, torch.bool, torch.uint8, torch.complex64, torch.complex128)


def check_arguments(kind: str, release: str, scores: str, vocabulary, blank, sentence_end, history,
                    features: TensorSpec) -> None:
    if kind not in KINDS:
        raise LabelScorerError(f"kind={kind!r}; choose from {sorted(KINDS)}", tensor="kind", rule="known kind")
    if release not in RELEASES:
        raise LabelScorerError(f"release={release!r}; choose from {sorted(RELEASES)}", tensor="release",
                               rule="known release")
    if KINDS[kind]["release"] == "transducer-pr" and release == "master":
        raise LabelScorerError("kind='transducer' (stateful-transducer-onnx) is only in RASR's open PR #149: pass "
                               "release='transducer-pr', or export the transducer for master as kind='fixed-context' "
                               "(a prediction network over the last labels)", tensor="release", rule="type in release")
    if scores not in ("log-probs", "costs"):
        raise LabelScorerError(f"scores={scores!r}; 'log-probs' (the graph negates them) or 'costs' (-log p)",
                               tensor="scores", rule="score convention")
    if not isinstance(vocabulary, (list, tuple)) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
        raise LabelScorerError("vocabulary must be a non-empty list of label strings (the lexicon's order)",
                               tensor="vocabulary", rule="vocabulary")
    _check_search_ids(kind, blank, sentence_end)
    needed = ("blank", blank) if kind in TIME_SYNC else ("sentence_end", sentence_end)
    if not isinstance(needed[1], int) or not 0 <= needed[1] < len(vocabulary):
        raise LabelScorerError(f"{needed[0]}={needed[1]!r}: a {kind} label scorer needs the {needed[0]} id, an int "
                               f"in 0..{len(vocabulary) - 1}", tensor=needed[0], rule=f"{needed[0]} id")
    if kind == "fixed-context" and (not isinstance(history, int) or history < 1):
        raise LabelScorerError(f"history={history!r}: the number of past labels, an int >= 1", tensor="history",
                               rule="history length")
    _check_features(features)


TIME_SYNC = ("transducer", "fixed-context", "ctc")  # decoded by lexiconfree-timesync-beam-search (blank); the others label-synchronously


def _check_search_ids(kind: str, blank, sentence_end) -> None:
    """An id the kind's search does not use is refused, not ignored: the label-synchronous search (stateful-onnx)
    has no blank, the time-synchronous one no sentence end, and a user passing one expects it to act."""
    if kind not in TIME_SYNC and blank is not None:
        raise LabelScorerError(f"blank={blank!r}: a {kind} label scorer is decoded by RASR's label-synchronous "
                               "search, which has no blank (it ends at sentence_end); leave blank out, or export a "
                               "time-synchronous kind ('transducer', 'fixed-context', 'ctc')", tensor="blank",
                               rule="ids the search uses")
    if kind in TIME_SYNC and sentence_end is not None:
        raise LabelScorerError(f"sentence_end={sentence_end!r}: a {kind} label scorer is decoded by RASR's "
                               "time-synchronous search, which ends at the last frame and has no sentence end; "
                               "leave sentence_end out (blank= is its id)", tensor="sentence_end",
                               rule="ids the search uses")


def _check_features(features: TensorSpec) -> None:
    if not isinstance(features, TensorSpec) or len(features.dims) != 3 or not isinstance(features.dims[0], Dim) \
            or not isinstance(features.dims[1], Dim) or not isinstance(features.dims[2], int):
        raise LabelScorerError("features must be a TensorSpec [Dim batch, Dim time, static F] (RASR feeds [1, T, F])",
                               graph="encoder", tensor=getattr(features, "name", None), rule="features [B, T, F]")
    if features.dtype != torch.float32:
        raise LabelScorerError(f"features {features.name!r} is {features.dtype}; RASR feeds float32", graph="encoder",
                               tensor=features.name, rule="dtype exactly as specified")
    if features.lengths and features.lengths_dtype != torch.int32:
        raise LabelScorerError(f"{features.onnx_names[1]!r} is int64; RASR's validator accepts int32 lengths only "
                               "(lengths_dtype=torch.int32)", graph="encoder", tensor=features.onnx_names[1],
                               rule="dtype exactly as specified")


def check_states(states: Sequence, batch: str, updater_states: Sequence[str], scorer_states: Sequence[str],
                 kind: str = "stateful") -> None:
    """Each state batchable by RASR: one batch axis, a concatenable dtype; another named dim only where it can be
    the encoder frames (``stateful``: measured in the rehearsal, ``frames_sized``)."""
    if not states:
        raise LabelScorerError("a stateful label scorer needs states= (StateSpecs, the hypothesis batch a Dim named "
                               f"{batch!r})", graph="state-initializer", rule="initializer declares >= 1 state")
    names = [s.name for s in states]
    for spec in states:
        try:
            batch_axis(spec, batch)
        except GraphContractError as exc:
            raise LabelScorerError(str(exc), graph="state-initializer", tensor=spec.name, rule=exc.rule) from None
        named = [d.name for d in spec.dims if isinstance(d, Dim) and d.name != batch]
        if named and kind != "stateful":
            raise LabelScorerError(f"state {spec.name!r}: its dim {named[0]!r} is named, but the {kind} "
                                   "initializer gets no encoder frames, so no state can be sized by them, and RASR "
                                   "cannot stack states of different sizes on axis 0: declare its fixed size",
                                   graph="state-initializer", tensor=spec.name, rule="state non-batch dims static")
        if spec.dtype in _NOT_CONCATENABLE:
            raise LabelScorerError(f"state {spec.name!r} is {spec.dtype}: RASR's Value::concat cannot stack it "
                                   "(float32, float64 and the integer types but uint8 work)", tensor=spec.name,
                                   rule="state dtype concatenable")
    for what, chosen in (("updater_states", updater_states), ("scorer_states", scorer_states)):
        unknown = [n for n in chosen if n not in names]
        if unknown or not chosen:
            raise LabelScorerError(f"{what}={list(chosen)}: each must be one of the states {names}, and at least "
                                   "one", graph="state-updater" if what[0] == "u" else "scorer",
                                   tensor=(unknown or [None])[0], rule=f"{what.split('_')[0]} states are initializer states")


def _grows(state: str, why: str) -> LabelScorerError:
    return LabelScorerError(f"state {state!r} grows with the label history ({why}): RASR stacks the states of "
                            "hypotheses of different lengths on axis 0, so it cannot batch it; keep it a fixed size "
                            "(or use state-managed-onnx, which this export does not write)", graph="state-updater",
                            tensor=state, rule="state non-batch dims static")


def _dims_text(spec) -> str:
    return "[" + ", ".join(d.name if isinstance(d, Dim) else str(d) for d in spec.dims) + "]"


def check_state_count(graph: str, values: Sequence[torch.Tensor], states: Sequence) -> None:
    if len(values) != len(states):
        raise LabelScorerError(f"graph {graph!r}: its callable returned {len(values)} tensors, {len(states)} states "
                               f"are declared ({[s.name for s in states]})", graph=graph, rule="returns every state")


def check_state_values(graph: str, values: Sequence[torch.Tensor], states: Sequence, batch: str,
                       hyps: int) -> None:
    """What a callable returned for the states, against the declaration at ``hyps`` hypotheses: the dtype, the
    rank, the batch and every static dim, the message naming the state and the dim measured. A named
    non-batch dim is measured by ``check_growth`` and ``frames_sized``."""
    check_state_count(graph, values, states)
    for spec, value in zip(states, values):
        if value.dtype != spec.dtype:
            raise LabelScorerError(f"graph {graph!r}: state {spec.name!r} is {value.dtype}, declared {spec.dtype}",
                                   graph=graph, tensor=spec.name, rule="one dtype per state in every graph")
        where = (f"graph {graph!r} returns state {spec.name!r} as {list(value.shape)} at {hyps} "
                 f"{'hypothesis' if hyps == 1 else 'hypotheses'}, declared {_dims_text(spec)}")
        if value.dim() != len(spec.dims):
            raise LabelScorerError(f"{where}: rank {value.dim()}, declared {len(spec.dims)}", graph=graph,
                                   tensor=spec.name, rule="states as declared")
        for axis, (dim, got) in enumerate(zip(spec.dims, value.shape)):
            is_batch = isinstance(dim, Dim) and dim.name == batch
            want = hyps if is_batch else dim
            if isinstance(want, int) and got != want:
                what = f"the hypothesis batch {batch!r} ({hyps})" if is_batch else str(want)
                raise LabelScorerError(f"{where}: dim {axis} is {got}, declared {what}", graph=graph,
                                       tensor=spec.name, rule="states as declared")


def check_growth(first: Sequence[torch.Tensor], new: Sequence[torch.Tensor], states: Sequence, batch: str) -> None:
    """A state longer after one update than after the initializer grows with the label history (measured,
    whatever was declared): RASR cannot stack hypotheses of different lengths."""
    for spec, a, b in zip(states, first, new):
        if a.dim() != b.dim():
            continue  # check_state_values names the rank
        axis_b = batch_axis(spec, batch)
        for axis in range(a.dim()):
            if axis != axis_b and a.shape[axis] != b.shape[axis]:
                raise _grows(spec.name, f"measured: dim {axis} is {a.shape[axis]} after the initializer, "
                                        f"{b.shape[axis]} after one update")


def frames_sized(first: Sequence[torch.Tensor], states: Sequence, batch: str, frames: int) -> Dict[str, List[int]]:
    """``{state: [axes]}`` of the named non-batch dims, each measured equal to the encoder frames ``T'`` (every
    hypothesis of one utterance has the same ``T'``, so RASR's concat on axis 0 holds, as for i6's
    accumulated attention weights ``[hyps, T', 1]``); a named dim of another size is refused."""
    found: Dict[str, List[int]] = {}
    for spec, value in zip(states, first):
        for axis, dim in enumerate(spec.dims):
            if not isinstance(dim, Dim) or dim.name == batch:
                continue
            if value.shape[axis] != frames:
                raise LabelScorerError(f"state {spec.name!r} dim {axis} is named {dim.name!r}, but measures "
                                       f"{value.shape[axis]} after the initializer and after an update, while the "
                                       f"encoder gave {frames} frames: a named non-batch dim must be the encoder "
                                       f"frames; declare it as the int {value.shape[axis]}", graph="state-initializer",
                                       tensor=spec.name, rule="state non-batch dims static or the encoder frames")
            found.setdefault(spec.name, []).append(axis)
    return found


def check_scores(scores: torch.Tensor, hyps: int, vocabulary: Sequence[str], convention: str) -> None:
    if scores.dim() != 2 or scores.shape[0] != hyps or scores.dtype != torch.float32:
        raise LabelScorerError(f"the scorer returned {scores.dtype} {list(scores.shape)} for {hyps} hypotheses; "
                               f"RASR reads float32 [B, V]", graph="scorer", tensor="scores", rule="scores [B, V] float32")
    if scores.shape[1] != len(vocabulary):
        raise LabelScorerError(f"the scores have {scores.shape[1]} columns, the vocabulary {len(vocabulary)} labels: "
                               "RASR indexes the row by the lexicon's label id", graph="scorer", tensor="scores",
                               rule="scores as wide as the vocabulary")
    check_normalized(scores, convention)


NORMALIZED_ATOL = 1e-3  # a row's log-sum-exp of log-probs: float32 log_softmax over 10^5 labels stays far inside


def score_kind(scores: torch.Tensor) -> str:
    """What the rows measure as: ``"log-probs"`` (log-sum-exp 0), ``"costs"`` (log-sum-exp of the negated 0),
    ``"probabilities"`` (in [0, 1], summing to 1), else ``"logits"`` (unnormalized)."""
    x = scores.double()
    if bool(((x.logsumexp(-1)).abs() <= NORMALIZED_ATOL).all()):
        return "log-probs"
    if bool(((-x).logsumexp(-1).abs() <= NORMALIZED_ATOL).all()):
        return "costs"
    if bool((x >= 0).all() and (x <= 1).all() and ((x.sum(-1) - 1).abs() <= NORMALIZED_ATOL).all()):
        return "probabilities"
    return "logits"


_ADVICE = {
    ("log-probs", "costs"): "these are costs already (-log p); pass scores='costs'",
    ("log-probs", "probabilities"): "these are probabilities: return their log (log_softmax instead of softmax)",
    ("log-probs", "logits"): "these are unnormalized logits: return logits.log_softmax(-1)",
    ("costs", "log-probs"): "these are log-probs; pass scores='log-probs' and the graph negates them",
    ("costs", "probabilities"): "these are probabilities: return -log of them (-log_softmax of the logits)",
    ("costs", "logits"): "these are unnormalized logits: return -logits.log_softmax(-1)",
}


def check_normalized(scores: torch.Tensor, convention: str) -> None:
    """RASR adds the costs of label scorers as ``-log p``: each row's log-sum-exp of the log-probs (of the
    negated costs) must be 0. Logits or probabilities declared as log-probs would decode as something else
    (and a proof comparing the graphs with the same wrong scores would pass), so they are refused with the
    advice that follows from what the rows measure as."""
    logp = scores.double() if convention == "log-probs" else -scores.double()
    lse = logp.logsumexp(-1)
    worst = int(lse.abs().argmax())
    if float(lse[worst].abs()) <= NORMALIZED_ATOL:
        return
    measured = score_kind(scores)
    raise LabelScorerError(f"scores={convention!r}, but row {worst}'s log-sum-exp of the "
                           f"{'scores' if convention == 'log-probs' else 'negated scores'} is {float(lse[worst]):.4g}, "
                           f"not 0 (RASR adds -log p of a normalized distribution): {_ADVICE[convention, measured]}",
                           graph="scorer", tensor="scores", rule="scores are costs")


def probe_lengths(fn, enc: torch.Tensor, lengths: torch.Tensor, *rest) -> bool:
    """Whether a callable reads the encoder lengths (changing them changes what it returns)."""
    from onnx_compat.pipeline.adapter import flatten
    with torch.no_grad():
        a = flatten(fn(*rest[:1], enc, lengths, *rest[1:]))
        b = flatten(fn(*rest[:1], enc, (lengths - 1).clamp(min=1), *rest[1:]))
    return not all(torch.equal(x, y) for x, y in zip(a, b))


def weights_owner(*callables) -> torch.nn.Module:
    """The module whose weights the callables use: a module itself, or the one a bound method belongs to."""
    for fn in callables:
        found = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
        if isinstance(found, torch.nn.Module):
            return found
    raise LabelScorerError("none of the callables is a module or a module's method: pass module= (the module "
                           "holding their weights)", tensor="module", rule="weights' module")
