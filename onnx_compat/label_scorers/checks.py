"""The user's arguments and callables checked in eager PyTorch, before any graph is exported.

Bad input is one ``LabelScorerError`` naming the culprit: an unknown kind or
release, int64 lengths, a state RASR cannot batch (no batch axis, a dim that
grows with the label history, a dtype ``Value::concat`` does not take), a
vocabulary of another size than the scores, scores whose sign contradicts
``scores=`` (log-probs declared as costs are all <= 0).
"""
from __future__ import annotations

from typing import Sequence

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
    needed = {"stateful": ("sentence_end", sentence_end)}.get(kind, ("blank", blank))
    if not isinstance(needed[1], int) or not 0 <= needed[1] < len(vocabulary):
        raise LabelScorerError(f"{needed[0]}={needed[1]!r}: a {kind} label scorer needs the {needed[0]} id, an int "
                               f"in 0..{len(vocabulary) - 1}", tensor=needed[0], rule=f"{needed[0]} id")
    if kind == "fixed-context" and (not isinstance(history, int) or history < 1):
        raise LabelScorerError(f"history={history!r}: the number of past labels, an int >= 1", tensor="history",
                               rule="history length")
    _check_features(features)


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


def check_states(states: Sequence, batch: str, updater_states: Sequence[str], scorer_states: Sequence[str]) -> None:
    """Each state batchable by RASR: one batch axis, no other named dim, a concatenable dtype."""
    if not states:
        raise LabelScorerError("a stateful label scorer needs states= (StateSpecs, the hypothesis batch a Dim named "
                               f"{batch!r})", graph="state-initializer", rule="initializer declares >= 1 state")
    names = [s.name for s in states]
    for spec in states:
        try:
            batch_axis(spec, batch)
        except GraphContractError as exc:
            raise LabelScorerError(str(exc), graph="state-initializer", tensor=spec.name, rule=exc.rule) from None
        grows = [d.name for d in spec.dims if isinstance(d, Dim) and d.name != batch]
        if grows:
            raise _grows(spec.name, f"its dim {grows[0]!r} is named, not a fixed size")
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


def check_state_values(graph: str, values: Sequence[torch.Tensor], states: Sequence, batch: str,
                       hyps: int) -> None:
    """What a callable returned for the states: the declared dtypes and shapes at ``hyps`` hypotheses."""
    if len(values) != len(states):
        raise LabelScorerError(f"graph {graph!r}: its callable returned {len(values)} tensors, {len(states)} states "
                               f"are declared ({[s.name for s in states]})", graph=graph, rule="returns every state")
    for spec, value in zip(states, values):
        want = [hyps if isinstance(d, Dim) else d for d in spec.dims]
        if value.dtype != spec.dtype:
            raise LabelScorerError(f"graph {graph!r}: state {spec.name!r} is {value.dtype}, declared {spec.dtype}",
                                   graph=graph, tensor=spec.name, rule="one dtype per state in every graph")
        if list(value.shape) != want:
            if value.dim() == len(want) and value.shape[batch_axis(spec, batch)] == hyps:
                raise _grows(spec.name, f"the {graph} returns {list(value.shape)}, declared {want}")
            raise LabelScorerError(f"graph {graph!r}: state {spec.name!r} has shape {list(value.shape)} at {hyps} "
                                   f"hypotheses, declared {want}", graph=graph, tensor=spec.name,
                                   rule="states as declared")


def check_scores(scores: torch.Tensor, hyps: int, vocabulary: Sequence[str], convention: str) -> None:
    if scores.dim() != 2 or scores.shape[0] != hyps or scores.dtype != torch.float32:
        raise LabelScorerError(f"the scorer returned {scores.dtype} {list(scores.shape)} for {hyps} hypotheses; "
                               f"RASR reads float32 [B, V]", graph="scorer", tensor="scores", rule="scores [B, V] float32")
    if scores.shape[1] != len(vocabulary):
        raise LabelScorerError(f"the scores have {scores.shape[1]} columns, the vocabulary {len(vocabulary)} labels: "
                               "RASR indexes the row by the lexicon's label id", graph="scorer", tensor="scores",
                               rule="scores as wide as the vocabulary")
    if convention == "costs" and bool((scores <= 0).all()):
        raise LabelScorerError("scores='costs' but every score is <= 0: these look like log-probs; pass "
                               "scores='log-probs' and the graph negates them (RASR wants -log p, lower is better)",
                               graph="scorer", tensor="scores", rule="scores are costs")
    if convention == "log-probs" and bool((scores >= 0).all()):
        raise LabelScorerError("scores='log-probs' but every score is >= 0: these look like costs already; pass "
                               "scores='costs'", graph="scorer", tensor="scores", rule="scores are costs")


def probe_lengths(fn, enc: torch.Tensor, lengths: torch.Tensor, *rest) -> bool:
    """Whether a callable reads the encoder lengths (changing them changes what it returns)."""
    from onnx_compat.pipeline.adapter import flatten
    with torch.no_grad():
        a = flatten(fn(*rest[:1], enc, lengths, *rest[1:]))
        b = flatten(fn(*rest[:1], enc, (lengths - 1).clamp(min=1), *rest[1:]))
    return not all(torch.equal(x, y) for x, y in zip(a, b))
