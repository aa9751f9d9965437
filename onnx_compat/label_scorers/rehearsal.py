"""The user's callables run once in eager PyTorch as the graphs will call them, before any export.

``rehearse`` calls the encoder, the initializer, the updater (three
hypotheses with distinct tokens) and the scorer the way the graphs will, and
checks what they return (``checks.py``): the encoder's frames and lengths
(at batch 1 RASR decodes every frame the encoder returns, so its lengths
must cover them), the states' shapes and dtypes as measured (a state longer
after an update grows with the label history; a named dim must measure as
the encoder frames), the scores' width, dtype and normalization, and that
the same call gives the same numbers twice (a module left in train mode, a
dropout, a random draw would make the proof compare two different decodes).
It also finds which callables read the encoder lengths.
``utterance_lengths`` picks the utterances the proof decodes.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from onnx_compat.errors import OnnxCompatError
from onnx_compat.parts.part import batch_axis
from onnx_compat.pipeline.adapter import flatten
from onnx_compat.spec import TensorSpec, make_inputs

from .checks import (check_growth, check_scores, check_state_count, check_state_values, frames_sized,
                     probe_lengths)
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


def in_train_mode(module: Optional[torch.nn.Module]) -> List[str]:
    """The module's submodules left in train mode (dropout draws, batch norm reads the batch), by name."""
    if module is None:
        return []
    return [name or type(module).__name__ for name, m in module.named_modules() if m.training]


def check_eval_mode(module: Optional[torch.nn.Module]) -> None:
    """A module left in train mode decodes differently at every call (dropout) or by the batch (batch norm),
    and the proof would then show two decodes without the cause: it is named, before any work."""
    training = in_train_mode(module)
    if training:
        raise LabelScorerError(f"the module is in train mode ({', '.join(training[:4])}"
                               f"{', ...' if len(training) > 4 else ''}): dropout draws at every call and batch norm "
                               "reads the batch, so neither the graphs nor a decode could be reproduced; call "
                               "model.eval() first", tensor="module", rule="module in eval mode")


def encode(fns: Callables, features: TensorSpec, x: torch.Tensor, n: torch.Tensor):
    """The user's encoder on ``x`` ``[B, T, F]``, its failure named as the features' (a wrong feature dim, a
    length the encoder cannot take) rather than surfacing as a torch error; at batch 1 its lengths must
    cover every frame it returns."""
    try:
        with torch.no_grad():
            frames, lengths = fns.encoder(x, n)
    except OnnxCompatError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's callable: any failure is the arguments' to name
        raise LabelScorerError(f"the encoder failed on features {list(x.shape)} (lengths {n.tolist()}) made from "
                               f"features={features.name!r} {[getattr(d, 'name', d) for d in features.dims]}: "
                               f"{type(exc).__name__}: {exc}; is the feature dim F={features.dims[2]} right, and does "
                               "the encoder take (features, lengths)?", graph="encoder", tensor=features.name,
                               rule="encoder runs on the declared features") from exc
    if x.shape[0] == 1:
        _check_batch1_lengths(frames, lengths, x.shape[1])
    return frames, lengths


def _check_batch1_lengths(frames: torch.Tensor, lengths, feature_frames: int) -> None:
    """RASR's ``onnx`` encoder reads batch 0 of the output, every frame of it: lengths shorter than the frames
    at batch 1 mean padding frames would be decoded (and both sides of a proof would decode them too)."""
    if not isinstance(lengths, torch.Tensor) or lengths.numel() != 1:
        raise LabelScorerError(f"the encoder returned lengths {lengths!r} at batch 1; expected one length [1]",
                               graph="encoder", tensor="outputs", rule="encoder lengths [B]")
    if int(lengths.reshape(-1)[0]) != frames.shape[1]:
        raise LabelScorerError(f"at batch 1 with {feature_frames} feature frames, the encoder returns "
                               f"{frames.shape[1]} frames but lengths {int(lengths.reshape(-1)[0])}: RASR decodes every "
                               "frame of the batch-1 output (it reads no output lengths), so the "
                               f"{frames.shape[1] - int(lengths.reshape(-1)[0])} padding frame(s) would be decoded; "
                               "return only the valid frames when the batch holds one utterance",
                               graph="encoder", tensor="outputs", rule="batch-1 frames all valid")


def _same_twice(graph: str, fns: Callables, fn, *args) -> None:
    """The callable gives the same numbers on the same inputs: else it draws, and the proof would compare two
    different decodes without saying why. The cause is named: the submodules left in train mode (dropout),
    or a random draw."""
    a, b = flatten(fn(*args)), flatten(fn(*args))
    if all(torch.equal(x, y) for x, y in zip(a, b)):
        return
    training = in_train_mode(fns.module)
    cause = (f"the module is in train mode ({', '.join(training[:4])}{', ...' if len(training) > 4 else ''}): "
             "call model.eval() before exporting" if training else
             "it draws random numbers (a dropout called with training=True, noise): remove the draw")
    raise LabelScorerError(f"graph {graph!r}: its callable returned other numbers when called twice on the same "
                           f"inputs, so no decode can be reproduced; {cause}", graph=graph,
                           tensor="module" if training else None, rule="module in eval mode" if training
                           else "deterministic callables")


def rehearse(kind, fns: Callables, features, encoder_dim, states, updater_states, scorer_states, vocabulary,
             convention, history, batch, seed, measured: Optional[dict] = None) -> Dict[str, bool]:
    """The callables run once as the graphs will call them; returns which read the encoder lengths.
    ``measured``, when given, receives ``frames_sized``: ``{state: [axes]}`` of the dims measured as the
    encoder frames."""
    hyps = 3
    with torch.no_grad():
        x, n = _example(features, 2, _example_time(features), seed)
        frames, _ = encode(fns, features, x, n)
        if frames.dim() != 3 or frames.shape[0] != 2 or frames.shape[2] != encoder_dim:
            raise LabelScorerError(f"the encoder returned {list(frames.shape)} for {list(x.shape)}; declared "
                                   f"[B, T', encoder_dim={encoder_dim}]", graph="encoder",
                                   tensor="encoder_states", rule="encoder frames [B, T', E]")
        e1, _ = encode(fns, features, x[:1, :int(n[0])], n[:1])
        _same_twice("encoder", fns, fns.encoder, x[:1, :int(n[0])], n[:1])
        n1 = torch.tensor([e1.shape[1]], dtype=torch.int32)
        token = torch.arange(1, hyps + 1) % len(vocabulary)
        frame = e1[:, -1].expand(hyps, -1)
        uses = {}
        if kind in STATEFUL:
            scores, uses = _rehearse_states(kind, fns, e1, n1, token, frame, states, updater_states, scorer_states,
                                            batch, hyps, measured)
        elif kind == "fixed-context":
            scores = fns.score(frame, torch.stack([token] * history, 1))
            _same_twice("scorer", fns, fns.score, frame, torch.stack([token] * history, 1))
        else:
            scores = fns.score(frame)
            _same_twice("scorer", fns, fns.score, frame)
        check_scores(scores, hyps, vocabulary, convention)
    return uses


def _rehearse_states(kind, fns: Callables, e1, n1, token, frame, states, updater_states, scorer_states, batch, hyps,
                     measured):
    """The initializer, one update of ``hyps`` hypotheses and the scorer; the states checked as measured."""
    init_args = (e1, n1) if kind == "stateful" else ()
    first = flatten(fns.initial(*init_args))
    _same_twice("state-initializer", fns, fns.initial, *init_args)
    check_state_values("state-initializer", first, states, batch, 1)
    tiled = {s.name: torch.cat([v] * hyps, dim=batch_axis(s, batch)) for s, v in zip(states, first)}
    upd = [tiled[name] for name in updater_states]
    enc_args = (e1.expand(hyps, -1, -1), n1.expand(hyps)) if kind == "stateful" else ()
    new = flatten(fns.update(token, *enc_args, *upd))
    check_state_count("state-updater", new, states)
    check_growth(first, new, states, batch)
    check_state_values("state-updater", new, states, batch, hyps)
    framed = frames_sized(first, states, batch, e1.shape[1])
    if measured is not None:
        measured["frames_sized"] = framed
    named = dict(zip([s.name for s in states], new))
    sc = [named[name] for name in scorer_states]
    score_args = sc if kind == "stateful" else [frame] + sc
    _same_twice("state-updater", fns, fns.update, token, *enc_args, *upd)
    _same_twice("scorer", fns, fns.score, *score_args)
    uses = {}
    if kind == "stateful":
        uses = {"state-initializer": probe_lengths(fns.initial, e1, n1),
                "state-updater": probe_lengths(fns.update, *enc_args, token, *upd)}
    return fns.score(*score_args), uses


def utterance_lengths(fns: Callables, features: TensorSpec, utterances, frames_example: int) -> List[int]:
    if utterances is not None:
        return checked_utterances(fns, features, utterances)
    example = _example_time(features)
    return [example, _long(fns, features, 4 * example, frames_example), _one_frame(fns, features)]


def checked_utterances(fns: Callables, features: TensorSpec, utterances) -> List[int]:
    """``utterances=`` as the proof needs them: ints the features' time dim allows, each giving >= 1 encoder
    frame (an empty encoder output would fail inside ONNX Runtime, far from the cause)."""
    dim = features.dims[1]
    if isinstance(utterances, (str, bytes)) or not hasattr(utterances, "__iter__") or not list(utterances):
        raise LabelScorerError(f"utterances={utterances!r}: a non-empty list of feature lengths", tensor="utterances",
                               rule="utterances the proof decodes")
    out = []
    for n in utterances:
        if not isinstance(n, int) or isinstance(n, bool) or n < max(1, dim.min) or (dim.max and n > dim.max):
            raise LabelScorerError(f"utterances={list(utterances)}: {n!r} is not a feature length the time dim "
                                   f"{dim.name!r} allows (an int in {max(1, dim.min)}..{dim.max or 'any'})",
                                   tensor="utterances", rule="utterances the proof decodes")
        try:
            got = _frames(fns, features, n)
        except LabelScorerError as exc:
            raise LabelScorerError(f"utterances={list(utterances)}: {n} feature frames: {exc}", graph="encoder",
                                   tensor="utterances", rule="utterances the proof decodes") from None
        if got < 1:
            raise LabelScorerError(f"utterances={list(utterances)}: {n} feature frames give no encoder frame; "
                                   "RASR would have nothing to decode", tensor="utterances",
                                   rule="utterances the proof decodes")
        out.append(n)
    return out


def _frames(fns: Callables, features: TensorSpec, n: int) -> int:
    frames, _ = encode(fns, features, torch.zeros(1, n, features.dims[2]), torch.tensor([n], dtype=torch.int32))
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
        except LabelScorerError as exc:
            if exc.rule == "batch-1 frames all valid":
                raise
            continue  # too short for this encoder: try one more frame
        if frames == 1:
            return n
        if frames > 1:
            break
    raise LabelScorerError("no utterance length gives exactly one encoder frame; pass utterances=",
                           graph="encoder", rule="one-frame utterance")
