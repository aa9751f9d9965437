"""The parts of a label scorer as RASR calls them, built around the user's callables.

The user writes each callable in PyTorch's own terms: the hypothesis batch
everywhere, tokens as int64, states in the layout their modules keep them,
log-probs. Each graph's wrapper does what RASR needs and the user should not
hand-write: the batch-1 encoder states (or the one encoder frame) repeated to
the hypotheses' batch, the int32 token cast, ``-log p`` (costs), the
lengths computed from the shape when the callable does not read them.
``parts`` then moves every state's batch first and writes the metadata
``{graph I/O name: state name}`` RASR matches states by.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch

from onnx_compat.parts import Part
from onnx_compat.parts.part import batch_axis
from onnx_compat.spec import Dim, TensorSpec

ENCODER_STATES = "encoder_states"
FRAMES = "frames"  # the encoder frames' dim in every graph (and in a state sized by them)
FRAMES_EXAMPLE = 16  # the decoder graphs' export example of encoder frames; the proof's long utterance has 4x


@dataclass
class Callables:
    """The user's parts: ``encoder(features, lengths) -> (frames, lengths)``; ``initial``, ``update``,
    ``score`` as ``export_label_scorer`` documents them for each kind."""

    encoder: Callable
    score: Callable
    initial: Optional[Callable] = None
    update: Optional[Callable] = None
    module: Optional[torch.nn.Module] = None

    def as_dict(self) -> Dict[str, Callable]:
        return {"encoder": self.encoder, "initial": self.initial, "update": self.update, "score": self.score}


def _full_lengths(enc: torch.Tensor) -> torch.Tensor:
    return torch.ones(enc.shape[0], dtype=torch.int32) * enc.shape[1]


def build(kind: str, fns: Callables, features: TensorSpec, encoder_dim: int, states: Sequence, updater_states,
          scorer_states, vocab: int, negate: bool, history: int, batch: str, uses_length: Mapping[str, bool]):
    """``(parts, io-map names per graph)``."""
    sign = -1.0 if negate else 1.0
    hyps, frames = Dim(batch), Dim(FRAMES)
    # without declared lengths RASR feeds no features-size: the encoder gets the full length of its batch
    encode = fns.encoder if features.lengths else (lambda x: fns.encoder(x, _full_lengths(x)))
    encoder = Part("encoder", encode, [features],
                   [TensorSpec(ENCODER_STATES, [features.dims[0], frames, encoder_dim], lengths=[1])], module=fns.module)
    maps = {"encoder": {"features": features.name, "outputs": ENCODER_STATES,
                        **({"features-size": features.onnx_names[1]} if features.lengths else {})}}
    scores = TensorSpec("scores", [hyps, vocab])
    token = TensorSpec("token", [hyps], torch.int32, values=(0, vocab))
    frame = TensorSpec("input_feature", [1, encoder_dim])
    names = [s.name for s in states]
    axes = {s.name: batch_axis(s, batch) for s in states}
    if kind == "stateful":
        parts = _stateful(fns, encoder_dim, frames, token, scores, names, updater_states, scorer_states, sign,
                          uses_length, maps)
    elif kind == "transducer":
        first = scorer_states[0]

        def score(f, *st):
            return sign * fns.score(f.expand(st[0].shape[axes[first]], -1), *st)

        parts = [Part("state-initializer", lambda: fns.initial(), states_out=names, module=fns.module, state_batch=1),
                 Part("state-updater", lambda tok, *st: fns.update(tok.long(), *st), [token],
                      states_in=updater_states, states_out=names, module=fns.module),
                 Part("scorer", score, [frame], [scores], states_in=scorer_states, module=fns.module)]
        maps.update({"state-updater": {"token": "token"}, "scorer": {"input-feature": frame.name, "scores": "scores"}})
    elif kind == "fixed-context":
        hist = TensorSpec("history", [hyps, history], torch.int32, values=(0, vocab))
        parts = [Part("scorer", lambda f, h: sign * fns.score(f.expand(h.shape[0], -1), h.long()), [frame, hist],
                      [scores], module=fns.module)]
        maps["scorer"] = {"input-feature": frame.name, "history": "history", "scores": "scores"}
    else:  # ctc: one frame per context, no state
        parts = [Part("scorer", lambda f: sign * fns.score(f), [TensorSpec("input_feature", [hyps, encoder_dim])],
                      [scores], module=fns.module)]
        maps["scorer"] = {"input-feature": "input_feature", "scores": "scores"}
    return [encoder] + parts, maps


def _stateful(fns: Callables, encoder_dim, frames, token, scores, names, updater_states, scorer_states, sign,
              uses_length, maps) -> List[Part]:
    def encoder_in(graph: str) -> TensorSpec:
        return TensorSpec(ENCODER_STATES, [1, frames, encoder_dim], lengths=[1] if uses_length[graph] else [])

    def initial(enc, *n):
        return fns.initial(enc, n[0] if n else _full_lengths(enc))

    def update(tok, enc, *rest):
        n, st = (rest[0], rest[1:]) if uses_length["state-updater"] else (None, rest)
        batch = tok.shape[0]
        lengths = (n if n is not None else _full_lengths(enc)).expand(batch)
        return fns.update(tok.long(), enc.expand(batch, -1, -1), lengths, *st)

    for graph in ("state-initializer", "state-updater"):
        maps[graph] = {"encoder-states": ENCODER_STATES,
                       **({"encoder-states-size": f"{ENCODER_STATES}:size1"} if uses_length[graph] else {})}
    maps["state-updater"]["token"] = "token"
    maps["scorer"] = {"scores": "scores"}
    return [Part("state-initializer", initial, [encoder_in("state-initializer")], states_out=names, module=fns.module,
                 state_batch=1),
            Part("state-updater", update, [token, encoder_in("state-updater")], states_in=updater_states,
                 states_out=names, module=fns.module),
            Part("scorer", lambda *st: sign * fns.score(*st), [], [scores], states_in=scorer_states, module=fns.module)]


def with_steps(kind: str, parts: Sequence[Part], maps: Mapping[str, Mapping[str, str]]) -> List[Part]:
    """Each graph's RASR step: its metadata ``{graph I/O name: state name}`` (how RASR matches states) and
    its per-graph rules, run by ``export()`` before the graph is written."""
    from .step import LabelScorerGraphStep
    for part in parts:
        part.steps = list(part.steps) + [LabelScorerGraphStep(kind, part.name, maps.get(part.name, {}), part.state_io(),
                                                                 FRAMES)]
    return list(parts)
