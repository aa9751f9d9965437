"""The user's callables run once in eager PyTorch as the graphs will call them, before any export.

``rehearse`` calls the encoder, the initializer, the updater (three
hypotheses with distinct tokens) and the scorer the way the graphs will, and
checks what they return (``checks.py``): the states' shapes and dtypes (a
state longer after an update grows with the label history), the scores'
width, sign and dtype. It also finds which callables read the encoder
lengths. ``utterance_lengths`` picks the utterances the proof decodes.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from onnx_compat.parts.part import batch_axis
from onnx_compat.pipeline.adapter import flatten
from onnx_compat.spec import TensorSpec, make_inputs

from .checks import check_scores, check_state_values, probe_lengths
from .errors import LabelScorerError
from .graphs import Callables
from .rasr_specs import STATEFUL


def _example(features: TensorSpec, batch: int, time_: int, seed: int):
    sizes = {features.dims[0].name: batch, features.dims[1].name: time_}
    feeds = make_inputs([features], sizes, seed=seed)
    x = feeds[features.name]
    n = feeds[features.onnx_names[1]] if features.lengths else torch.full((batch,), time_, dtype=torch.int32)
    return x, n


def _example_time(features: TensorSpec) -> int:
    dim = features.dims[1]
    return dim.example or max(37, 2 * dim.min)


def rehearse(kind, fns: Callables, features, encoder_dim, states, updater_states, scorer_states, vocabulary,
              convention, history, batch, seed) -> Dict[str, bool]:
    """The callables run once as the graphs will call them; returns which read the encoder lengths."""
    hyps = 3
    with torch.no_grad():
        x, n = _example(features, 2, _example_time(features), seed)
        frames, _ = fns.encoder(x, n)
        if frames.dim() != 3 or frames.shape[0] != 2 or frames.shape[2] != encoder_dim:
            raise LabelScorerError(f"the encoder returned {list(frames.shape)} for {list(x.shape)}; declared "
                                          f"[B, T', encoder_dim={encoder_dim}]", graph="encoder",
                                          tensor="encoder_states", rule="encoder frames [B, T', E]")
        e1 = frames[:1]
        n1 = torch.tensor([frames.shape[1]], dtype=torch.int32)
        token = torch.arange(1, hyps + 1) % len(vocabulary)
        frame = e1[:, -1].expand(hyps, -1)
        uses = {}
        if kind in STATEFUL:
            init_args = (e1, n1) if kind == "stateful" else ()
            first = flatten(fns.initial(*init_args))
            check_state_values("state-initializer", first, states, batch, 1)
            tiled = {s.name: torch.cat([v] * hyps, dim=batch_axis(s, batch)) for s, v in zip(states, first)}
            upd = [tiled[name] for name in updater_states]
            enc_args = (e1.expand(hyps, -1, -1), n1.expand(hyps)) if kind == "stateful" else ()
            new = flatten(fns.update(token, *enc_args, *upd))
            check_state_values("state-updater", new, states, batch, hyps)
            named = dict(zip([s.name for s in states], new))
            sc = [named[name] for name in scorer_states]
            scores = fns.score(*(sc if kind == "stateful" else [frame] + sc))
            if kind == "stateful":
                uses = {"state-initializer": probe_lengths(fns.initial, e1, n1),
                        "state-updater": probe_lengths(fns.update, *enc_args, token, *upd)}
        elif kind == "fixed-context":
            scores = fns.score(frame, torch.stack([token] * history, 1))
        else:
            scores = fns.score(frame)
        check_scores(scores, hyps, vocabulary, convention)
    return uses


def utterance_lengths(fns: Callables, features: TensorSpec, utterances, frames_example: int) -> List[int]:
    if utterances is not None:
        return [int(n) for n in utterances]
    example = _example_time(features)
    return [example, _long(fns, features, 4 * example, frames_example), _one_frame(fns, features)]


def _frames(fns: Callables, features: TensorSpec, n: int) -> int:
    with torch.no_grad():
        frames, _ = fns.encoder(torch.zeros(1, n, features.dims[2]), torch.tensor([n], dtype=torch.int32))
    return frames.shape[1]


def _long(fns: Callables, features: TensorSpec, n: int, frames_example: int) -> int:
    """At least four times the encoder's export example in feature frames, and four times the decoder graphs'
    example in encoder frames."""
    while _frames(fns, features, n) < 4 * frames_example:
        n *= 2
    return n


def _one_frame(fns: Callables, features: TensorSpec) -> int:
    """The fewest feature frames that give one encoder frame (the encoder may refuse fewer)."""
    for n in range(max(1, features.dims[1].min), 257):
        try:
            frames = _frames(fns, features, n)
        except Exception:  # noqa: BLE001 - too short for this encoder: try one more frame
            continue
        if frames == 1:
            return n
        if frames > 1:
            break
    raise LabelScorerError("no utterance length gives exactly one encoder frame; pass utterances=",
                                  graph="encoder", rule="one-frame utterance")
