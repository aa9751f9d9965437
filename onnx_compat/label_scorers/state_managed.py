"""``kind="state-managed"``: RASR's ``state-managed-onnx`` label scorer, one graph whose states RASR manages.

For what the other kinds cannot carry: a Transformer decoder's self-attention cache grows with the label
history, so RASR's ``transformer`` state manager holds one position per label and hands the graph every
ancestor's, stacked on the one symbolic dim and left-padded with zeros to the longest prefix of the batch;
the ``lstm`` manager holds ``[S]`` rows, zeros first. The user writes the step in PyTorch's terms; the
wrapper here makes it the graph RASR calls (int32 ``token [B, S]`` and its lengths, ``prefix-length``, the
batch-1 encoder states repeated to the hypotheses, costs ``[B, S, V]``, the ``STATE_`` metadata).

Flow: arguments checked -> the step rehearsed in eager PyTorch (zero-length prefix, a longer one, which
layout the states come back in) -> the graphs exported and verified at new shapes by ``export()`` into a
temporary folder -> RASR's loader emulated with the config fragment as written (``managers.findings``) ->
the decode proof through the graphs as RASR calls them against the same search over the eager wrapper, and a
batch of hypotheses of different prefix lengths, row by row against each alone -> the folder.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch

from onnx_compat.model_state import preserved
from onnx_compat.parts.export import PartsReport, _move_into, _own_sizes
from onnx_compat.parts.part import Part, PartModule
from onnx_compat.pipeline.adapter import flatten
from onnx_compat.pipeline.files import write_text_atomically
from onnx_compat.spec import Dim, TensorSpec

from . import config, folders, managers
from .api import CONFIG_FILE, FRAMES_EXAMPLE, REPORT_FILE, LabelScorerReport, _owner
from .checks import _check_features, check_scores
from .errors import DecodeMismatch, LabelScorerError
from .graphs import ENCODER_STATES, Callables
from .managed_search import Ctx, GraphRun, ManagedScorer, eager_call, session_call
from .proof import check_decoded
from .rasr_specs import KINDS, graphs_of
from .rehearsal import check_eval_mode, utterance_lengths
from .search import label_sync

SIZES = {"suffix": 3, "prefix": 5, "history": 2, "frames": FRAMES_EXAMPLE}


@dataclass
class StateManagedReport(LabelScorerReport):
    manager: str = ""
    layout: str = ""  # "cache" (one position per label), "recurrent" ([B, S]) or "recurrent-stacked"
    notes: List[str] = field(default_factory=list)  # what RASR would do wrong and what was written instead
    mixed_batch: dict = field(default_factory=dict)  # hypotheses of different prefix lengths in one run


_NOT_HERE = ("initial", "update", "updater_states", "scorer_states", "blank")


def dispatch(folder: str, params: Mapping[str, object]) -> StateManagedReport:
    """``export_label_scorer(kind="state-managed", ...)``: the arguments another kind takes refused, the
    rest handed to ``export_state_managed`` (``start_label`` is RASR's one ``start-labels`` entry)."""
    if params["kind"] == "full-context":
        return _full_context(folder, params)
    if params["kind"] != "state-managed":
        raise LabelScorerError(f"manager= is for kind='state-managed', not kind={params['kind']!r}",
                               tensor="manager", rule="manager for state-managed")
    given = [k for k in _NOT_HERE if params[k] is not None] + [
        k for k, default in (("history", 1), ("release", "master"), ("max_symbols", 3)) if params[k] != default]
    if given:
        raise LabelScorerError(f"kind='state-managed' takes one step callable (score=) and RASR master: "
                               f"{given} belong to other kinds", tensor=given[0], rule="arguments of the kind")
    keys = ("manager", "score", "states", "vocabulary", "sentence_end", "encoder", "features", "encoder_dim",
            "scores", "batch", "module", "exporter", "utterances", "max_labels", "beam", "atol", "rtol", "seed",
            "progress")
    return export_state_managed(folder, start_labels=[params["start_label"]], **{k: params[k] for k in keys})


def _full_context(folder: str, params: Mapping[str, object]):
    """``kind="full-context"``: only in RASR's open PR #241, so opt-in with ``release="full-context-pr"``."""
    from .full_context import RELEASE, export_full_context
    if params["release"] != RELEASE:
        raise LabelScorerError(f"kind='full-context' (full-context-onnx) is only in RASR's open PR #241: pass "
                               f"release={RELEASE!r}, or write the decoder for master as kind='state-managed'",
                               tensor="release", rule="type in release")
    given = [k for k in _NOT_HERE + ("manager",) if params[k] is not None] + (["states"] if params["states"] else []) \
        + [k for k, default in (("history", 1), ("max_symbols", 3)) if params[k] != default]
    if given:
        raise LabelScorerError(f"kind='full-context' takes one callable (score=) of the whole history: {given} "
                               "belong to other kinds", tensor=given[0], rule="arguments of the kind")
    keys = ("score", "vocabulary", "sentence_end", "start_label", "encoder", "features", "encoder_dim", "scores",
            "batch", "module", "exporter", "utterances", "max_labels", "beam", "atol", "rtol", "seed", "progress")
    return export_full_context(folder, **{k: params[k] for k in keys})


@dataclass
class EagerSide:
    """What the PyTorch side of a search needs of a written state-managed scorer (kept on the report object,
    not in ``report.json``): the wrapper module in eager mode, its ONNX input and output names, the encoder."""

    module: torch.nn.Module
    inputs: List[str]
    outputs: List[str]
    encoder: Optional[Callable]


@dataclass
class _Layout:
    """What the graph looks like: the states' flavour, the manager written, the max-history key."""

    manager: str
    flavour: str
    max_history: Optional[int] = None
    notes: List[str] = field(default_factory=list)


def export_state_managed(folder: str, *, manager: str, score: Callable, states: Sequence, vocabulary: Sequence[str],
                         sentence_end: int, start_labels: Sequence[int] = (0,), encoder: Optional[Callable] = None,
                         features: Optional[TensorSpec] = None, encoder_dim: Optional[int] = None,
                         scores: str = "log-probs", batch: str = "hyps", module: Optional[torch.nn.Module] = None,
                         exporter: Union[str, Mapping[str, str]] = "auto", utterances: Optional[Sequence[int]] = None,
                         max_labels: int = 20, beam: int = 4, atol: float = 1e-4, rtol: float = 1e-3,
                         seed: int = 0, progress: Optional[Callable[[str], None]] = None) -> StateManagedReport:
    """Export ``score`` as RASR's ``state-managed-onnx`` into ``folder`` (with the encoder when given, as an
    ``encoder-decoder``); prove it by decoding; return the report.

    ``manager="transformer"``, states ``StateSpec(name, [Dim(batch), Dim(time), static...])`` (a KV cache):
    ``score(tokens [B, S], token_lengths [B], prefix_lengths [B], *caches, [frames [B, T', E], lengths [B]])
    -> (log_probs [B, S, V], *new_caches)``; each cache holds the prefix right-aligned (row b's last
    ``prefix_lengths[b]`` positions; the ones before are padding the step must mask), the new ones the
    suffix's positions ``[B, S, ...]`` (or prefix and suffix). ``manager="lstm"``, states
    ``StateSpec(name, [Dim(batch), S])``: ``score(token [B], *states, [frames, lengths]) -> (log_probs
    [B, V], *new_states)``, states zeros first. The same ``[B, S]`` states with ``manager="transformer"``
    are carried as one position each (``max-history = 1``): what an LSTM LM without encoder needs, since
    the lstm manager meets undefined behaviour in RASR master there (``managers.UNDEFINED_START``; refused).
    ``start_labels``: RASR's ``start-labels`` (the first context's labels; at least one). Tokens are int64,
    lengths int64, in the callable. The LM proof generates up to ``max_labels``; the AED's decodes utterances
    (default: the example, one four times longer, one of a single encoder frame) up to 2 labels per frame.
    ``progress``: told each stage as it starts.
    """
    tell = progress or (lambda stage: None)
    t0 = time.perf_counter()
    layout = _checked(manager, states, batch, vocabulary, sentence_end, start_labels, encoder, features,
                      encoder_dim, scores, beam)
    owner = module or _owner(*(f for f in (score, encoder) if f is not None))
    check_eval_mode(owner)
    folder = config.check_value(os.path.abspath(folder), "folder")
    earlier = earlier_files(folder, {"scorer.onnx"} | ({"encoder.onnx"} if encoder is not None else set()))
    sign = -1.0 if scores == "log-probs" else 1.0
    tell("rehearsing the step in PyTorch")
    uses_length = _rehearse(layout, score, states, batch, vocabulary, scores, encoder, features, encoder_dim, seed)
    wrapper = StepGraph(score, owner, layout.flavour, len(states), encoder is not None, uses_length, sign)
    inputs, outputs, maps = _specs(layout, states, batch, len(vocabulary), encoder_dim, uses_length,
                                   _suffix_out(layout, score, states, batch, encoder, encoder_dim))
    check_inputs_used(wrapper, inputs, seed, zeroed={"token_length", maps["scorer"].get("prefix-length")}
                      if layout.flavour != "cache" else set())
    metadata = {managers.STATE_PREFIX + f"{s.name}_in": f"{s.name}_out" for s in states}
    graphs = [("scorer", wrapper, inputs, outputs, metadata)]
    if encoder is not None:
        graphs.insert(0, _encoder_graph(encoder, owner, features, encoder_dim, maps))
    text = fragment(folder, maps, layout, start_labels, encoder is not None)
    report = StateManagedReport(folder, "state-managed", managers.RASR_TYPE, "master", config=text,
                                uses_encoder_lengths={"scorer": uses_length} if encoder is not None else {},
                                manager=layout.manager, layout=layout.flavour, notes=list(layout.notes))
    feats = None
    if encoder is not None:
        fns = Callables(encoder, score, module=owner)
        gen = np.random.default_rng(seed)
        feats = [gen.standard_normal((1, n, features.dims[2])).astype(np.float32)
                 for n in utterance_lengths(fns, features, utterances, FRAMES_EXAMPLE)]
    report.eager = EagerSide(wrapper, [n for s in inputs for n in s.onnx_names], [o.name for o in outputs], encoder)
    proof = _proof(report, text, wrapper, [s.onnx_names for s in inputs], outputs, encoder, feats, len(vocabulary),
                   sentence_end, beam, max_labels)
    tell(f"exporting {', '.join(g[0] for g in graphs)}; then RASR's loader and the decode proof")
    parts = _export_graphs(graphs, folder, exporter, atol, rtol, seed, proof, {CONFIG_FILE: text})
    finish(report, parts, earlier, t0)
    return report


def finish(report, parts: PartsReport, earlier: Sequence[str], t0: float) -> None:
    """The graphs' summary into the report, an earlier export's files not written again removed, the report
    written last: a ``report.json`` in the folder means every step passed."""
    summary = parts.to_dict()
    report.graphs, report.files = summary["graphs"], dict(parts.files)
    report.removed = folders.remove_stale(report.folder, earlier, list(parts.files.values()))
    report.files["report"] = os.path.join(report.folder, REPORT_FILE)
    report.timings["total"] = time.perf_counter() - t0
    write_text_atomically(report.files["report"], report.to_json() + "\n")


def earlier_files(folder: str, writes: set) -> List[str]:
    """``folders.earlier_files`` for these kinds' files: what an earlier export's report names (removed once
    this one is written, if not written again); a label scorer's graph that no report names is refused."""
    if not os.path.isdir(folder):
        return []
    own = folders._report_files(folder)
    known = {f"{g}.onnx" for k in KINDS for g in graphs_of(k)}
    foreign = sorted(n for n in os.listdir(folder) if n in known - writes and os.path.join(folder, n) not in own)
    if foreign:
        raise LabelScorerError(f"the folder {folder!r} holds {foreign}, which this export does not write and no "
                               "report.json of an earlier export there names: beside the new label-scorer.config "
                               "they would be read as part of it, and they may be yours; move them or choose "
                               "another folder", tensor=foreign[0], rule="folder holds no stale graphs")
    return own


def _checked(manager, states, batch, vocabulary, sentence_end, start_labels, encoder, features, encoder_dim,
             scores, beam) -> _Layout:
    """Every argument a user can get wrong, refused before any export; which graph layout the states get."""
    if manager not in managers.MANAGERS:
        raise LabelScorerError(f"manager={manager!r}; RASR's state managers written here: {managers.MANAGERS}",
                               tensor="manager", rule="known state manager")
    if scores not in ("log-probs", "costs"):
        raise LabelScorerError(f"scores={scores!r}; 'log-probs' or 'costs'", tensor="scores", rule="score convention")
    if not isinstance(vocabulary, (list, tuple)) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
        raise LabelScorerError("vocabulary must be a non-empty list of label strings (the lexicon's order)",
                               tensor="vocabulary", rule="vocabulary")
    for name, value in (("sentence_end", sentence_end),) + tuple(("start_labels", v) for v in start_labels):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(vocabulary):
            raise LabelScorerError(f"{name}: {value!r} is not a label id in 0..{len(vocabulary) - 1}", tensor=name,
                                   rule=f"{name} ids")
    if not list(start_labels):
        raise LabelScorerError("start_labels=(): RASR then scores the root context, which has no parent "
                               "(cacheStatesAndScores reads parent->labelSeq: a null dereference); give the "
                               "start label, e.g. (sentence_end,)", tensor="start_labels", rule="start-labels set")
    if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
        raise LabelScorerError(f"beam={beam!r}: an int >= 1", tensor="beam", rule="beam width")
    if encoder is not None:
        _check_features(features)
        if not isinstance(encoder_dim, int) or encoder_dim < 1:
            raise LabelScorerError(f"encoder_dim={encoder_dim!r}: the encoder frames' size, an int",
                                   graph="encoder", tensor="encoder_dim", rule="encoder frames [B, T', E]")
    flavour = _flavour(states, batch, manager)
    if manager == "lstm" and encoder is None:
        raise LabelScorerError(f"manager='lstm' without encoder states: {managers.UNDEFINED_START}. Pass "
                               "manager='transformer' with the same [B, S] states and step: the graph then takes "
                               "each state as one position of the transformer manager (max-history = 1), whose "
                               "contexts keep their parents", graph="scorer", tensor="state-manager.type",
                               rule="lstm manager needs an encoder input")
    if manager == "transformer" and flavour == "recurrent":
        return _Layout("transformer", "recurrent-stacked", 1, [
            "[B, S] states written for the transformer manager (one position each, max-history = 1) because the "
            "lstm manager without encoder states meets undefined behaviour in RASR master: " +
            managers.UNDEFINED_START])
    return _Layout(manager, flavour)


def _flavour(states, batch: str, manager: str) -> str:
    from onnx_compat.streaming import StateSpec
    if not states:
        raise LabelScorerError("states= is empty: RASR errors 'Initial recurrent state is empty.'", graph="scorer",
                               rule="at least one state")
    kinds = set()
    for spec in states:
        if not isinstance(spec, StateSpec):
            raise LabelScorerError(f"states holds {spec!r}; StateSpecs", graph="scorer", rule="states as StateSpecs")
        dims = list(spec.dims)
        named = [i for i, d in enumerate(dims) if isinstance(d, Dim)]
        if not dims or not isinstance(dims[0], Dim) or dims[0].name != batch:
            raise LabelScorerError(f"state {spec.name!r}: dim 0 must be the hypothesis batch Dim({batch!r}) (RASR "
                                   f"stacks hypotheses on axis 0), got {spec.describe()['dims']}", graph="scorer",
                                   tensor=spec.name, rule="state batch first")
        if spec.dtype != torch.float32:
            raise LabelScorerError(f"state {spec.name!r} is {spec.dtype}: RASR's state managers hold float32",
                                   graph="scorer", tensor=spec.name, rule="state float32")
        if len(dims) == 2 and named == [0]:
            kinds.add("recurrent")
        elif len(named) == 2 and manager == "transformer":
            kinds.add("cache")
        else:
            want = ("[Dim(batch), S]" if manager == "lstm" else
                    "[Dim(batch), Dim(time), static...] (a cache) or [Dim(batch), S] (a recurrent state)")
            raise LabelScorerError(f"state {spec.name!r} has dims {spec.describe()['dims']}; the {manager} manager "
                                   f"takes {want}", graph="scorer", tensor=spec.name, rule=f"{manager} manager state dims")
    if len(kinds) > 1:
        raise LabelScorerError("states mix caches and [B, S] states; one graph has one kind", graph="scorer",
                               tensor=states[0].name, rule="one state layout")
    return kinds.pop()


def _step_args(flavour: str, tokens, token_lengths, prefix_lengths, states, enc_args):
    if flavour == "cache":
        return (tokens, token_lengths, prefix_lengths, *states, *enc_args)
    return (tokens[:, 0], *states, *enc_args)


def _rehearse(layout: _Layout, score, states, batch, vocabulary, convention, encoder, features, encoder_dim,
              seed) -> bool:
    """The step run in eager PyTorch as the graph will run it, from a zero-length prefix: scores' shape, sign
    and width, the states' shapes; returns whether it reads the encoder lengths."""
    hyps, vocab = 3, len(vocabulary)
    gen = torch.Generator().manual_seed(seed)
    enc_args = ()
    if encoder is not None:
        with torch.no_grad():
            x = torch.randn(2, max(37, 2 * features.dims[1].min), features.dims[2], generator=gen)
            frames, _ = encoder(x, torch.full((2,), x.shape[1], dtype=torch.int32))
        if frames.dim() != 3 or frames.shape[0] != 2 or frames.shape[2] != encoder_dim:
            raise LabelScorerError(f"the encoder returned {list(frames.shape)} for {list(x.shape)}; declared [B, T', "
                                   f"encoder_dim={encoder_dim}]", graph="encoder", tensor=ENCODER_STATES,
                                   rule="encoder frames [B, T', E]")
        enc = frames[:1].expand(hyps, -1, -1)
        enc_args = (enc, torch.full((hyps,), enc.shape[1], dtype=torch.long))
    tokens = (torch.arange(hyps) % vocab)[:, None]
    ones = torch.ones(hyps, dtype=torch.long)
    with torch.no_grad():
        out = flatten(score(*_step_args(layout.flavour, tokens, ones, ones * 0, _zeros(states, hyps, 0), enc_args)))
    if len(out) != 1 + len(states):
        raise LabelScorerError(f"the step returned {len(out)} tensors; log-probs and the {len(states)} states "
                               "expected", graph="scorer", rule="returns scores then states")
    rows = out[0][:, -1] if layout.flavour == "cache" and out[0].dim() == 3 else out[0]
    check_scores(rows, hyps, vocabulary, convention)
    for spec, value in zip(states, out[1:]):
        want = [hyps] + [1 if isinstance(d, Dim) else d for d in spec.dims[1:]]
        if list(value.shape) != want or value.dtype != torch.float32:
            raise LabelScorerError(f"state {spec.name!r} came back {value.dtype} {list(value.shape)} from a "
                                   f"zero-length prefix and one label; expected float32 {want}", graph="scorer",
                                   tensor=spec.name, rule="states as declared")
    if encoder is None:
        return False
    with torch.no_grad():
        other = flatten(score(*_step_args(layout.flavour, tokens, ones, ones * 0, _zeros(states, hyps, 0),
                                          (enc_args[0], (enc_args[1] - 1).clamp(min=1)))))
    return not all(torch.equal(a, b) for a, b in zip(out, other))


def _zeros(states, hyps: int, prefix: int) -> List[torch.Tensor]:
    return [torch.zeros([hyps] + [prefix if isinstance(d, Dim) else d for d in s.dims[1:]]) for s in states]


def _suffix_out(layout: _Layout, score, states, batch, encoder, encoder_dim) -> bool:
    """Whether a cache step returns the suffix's positions only (else prefix and suffix)."""
    if layout.flavour != "cache":
        return True
    hyps, prefix = 2, 3
    enc_args = () if encoder is None else (torch.zeros(hyps, 4, encoder_dim), torch.full((hyps,), 4))
    ones = torch.ones(hyps, dtype=torch.long)
    caches = [torch.randn(c.shape) for c in _zeros(states, hyps, prefix)]
    with torch.no_grad():
        out = flatten(score(*_step_args("cache", torch.zeros(hyps, 1, dtype=torch.long), ones, ones * prefix, caches,
                                        enc_args)))
    for spec, value in zip(states, out[1:]):
        axis = [i for i, d in enumerate(spec.dims) if isinstance(d, Dim)][1]
        if value.shape[axis] not in (1, prefix + 1):
            raise LabelScorerError(f"state {spec.name!r}: after a prefix of {prefix} and one label the step returned "
                                   f"{value.shape[axis]} positions; RASR reads the suffix's (1) or prefix and suffix "
                                   f"({prefix + 1})", graph="scorer", tensor=spec.name, rule="cache out: suffix")
    return out[1].shape[[i for i, d in enumerate(states[0].dims) if isinstance(d, Dim)][1]] == 1


class StepGraph(torch.nn.Module):
    """The user's step as the graph RASR calls: ONNX inputs ``token``, its length, the states (the first
    with its length: ``prefix-length``), the encoder states and their size; outputs costs, the states."""

    def __init__(self, step: Callable, owner: Optional[torch.nn.Module], flavour: str, n_states: int, encoder: bool,
                 encoder_lengths: bool, sign: float) -> None:
        super().__init__()
        self.step, self.owner, self.flavour, self.n = step, owner, flavour, n_states
        self.encoder, self.encoder_lengths, self.sign = encoder, encoder_lengths, sign

    def forward(self, token, token_length, *rest):
        rest = list(rest)
        prefix = None
        if self.flavour != "recurrent":
            states = [rest.pop(0)]
            prefix = rest.pop(0).long()
            states += [rest.pop(0) for _ in range(self.n - 1)]
        else:
            states = [rest.pop(0) for _ in range(self.n)]
        enc_args = ()
        if self.encoder:
            enc = rest.pop(0)
            lengths = rest.pop(0) if self.encoder_lengths else torch.ones(1, dtype=torch.int32) * enc.shape[1]
            enc_args = (enc.expand(token.shape[0], -1, -1), lengths.long().expand(token.shape[0]))
        if self.flavour == "cache":
            out = flatten(self.step(token.long(), token_length.long(), prefix, *states, *enc_args))
            return (self.sign * out[0],) + tuple(out[1:])
        if self.flavour == "recurrent-stacked":  # the parent's state: the last position, zeros for no prefix
            has = (prefix > 0)[:, None]
            states = [torch.where(has, torch.cat([torch.zeros_like(s.sum(1, keepdim=True)), s], 1)[:, -1], 0.0)
                      for s in states]
        out = flatten(self.step(token[:, 0].long(), *states, *enc_args))
        keep = (token_length > 0)[:, None]  # a zero-length suffix leaves the state as it was
        new = [torch.where(keep, n, s) for n, s in zip(out[1:], states)]
        if self.flavour == "recurrent-stacked":
            new = [n[:, None] for n in new]
        return (self.sign * out[0][:, None],) + tuple(new)


def _specs(layout: _Layout, states, batch, vocab, encoder_dim, uses_length, suffix_only):
    """The graph's inputs and outputs and the io-map (RASR spec key -> ONNX name)."""
    hyps = Dim(batch)
    if layout.flavour == "cache":
        suffix = Dim("suffix")
        token = TensorSpec("token", [hyps, suffix], torch.int32, lengths=[1], values=(0, vocab))
        inputs = [token]
        maps = {"token": "token", "token-length": "token:size1"}
        time_dim = Dim("prefix")
    else:
        suffix = 1
        inputs = [TensorSpec("token", [hyps, 1], torch.int32, values=(0, vocab)),
                  TensorSpec("token_length", [hyps], torch.int32, values=(1, 2))]
        maps = {"token": "token", "token-length": "token_length"}
        time_dim = Dim("history")
    outputs = [TensorSpec("scores", [hyps, suffix, vocab])]
    for i, spec in enumerate(states):
        rest = [d for d in spec.dims[1:] if not isinstance(d, Dim)]
        if layout.flavour == "recurrent":
            inputs.append(TensorSpec(f"{spec.name}_in", [hyps] + rest))
            outputs.append(TensorSpec(f"{spec.name}_out", [hyps] + rest))
            continue
        dims = [hyps] + [time_dim if isinstance(d, Dim) else d for d in spec.dims[1:]]
        if layout.flavour == "recurrent-stacked":
            dims = [hyps, time_dim] + rest
        inputs.append(TensorSpec(f"{spec.name}_in", dims, lengths=[dims.index(time_dim)] if i == 0 else []))
        out_time = suffix if layout.flavour == "cache" and suffix_only else (1 if layout.flavour != "cache" else None)
        outputs.append(TensorSpec(f"{spec.name}_out", [out_time if d is time_dim else d for d in dims]))
        if i == 0:
            maps["prefix-length"] = inputs[-1].onnx_names[1]
    scorer_map = {**maps, "scores": "scores"}
    result = {"scorer": scorer_map}
    if encoder_dim is not None:
        inputs.append(TensorSpec(ENCODER_STATES, [1, Dim("frames"), encoder_dim], lengths=[1] if uses_length else []))
        scorer_map["encoder-states"] = ENCODER_STATES
        if uses_length:
            scorer_map["encoder-states-size"] = f"{ENCODER_STATES}:size1"
    return inputs, outputs, result


def check_inputs_used(wrapper: torch.nn.Module, inputs: Sequence[TensorSpec], seed: int, zeroed=frozenset()) -> None:
    """Each graph input, changed alone, changes an output: a step that ignores one (its token lengths, the
    prefix lengths that mark the padding) would be written without it, and RASR's io-map would name an input
    the graph lacks. ``zeroed``: inputs changed to 0 (a one-label suffix's length, which then keeps the old
    state; a one-position history's length, which then starts from zeros)."""
    from onnx_compat.parts.probe import _changed, example_feeds
    from onnx_compat.spec import dim_sizes
    feeds = example_feeds(inputs, dim_sizes(inputs, _own_sizes(inputs, SIZES)), seed)
    owner = {n: spec for spec in inputs for n in spec.onnx_names}
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad(), preserved(wrapper):
        base = flatten(wrapper(*feeds.values()))
        for name, value in feeds.items():
            other = dict(feeds)
            other[name] = value * 0 if name in zeroed else _changed(name, value, owner[name], gen)
            if all(torch.equal(a, b) for a, b in zip(base, flatten(wrapper(*other.values())))):
                raise LabelScorerError(f"the step ignores graph input {name!r} (changed alone, no output changed): "
                                       "the exporter would leave it out and RASR's io-map would name an input the "
                                       "graph lacks", graph="scorer", tensor=name, rule="every input is used")


def _encoder_graph(encoder, owner, features: TensorSpec, encoder_dim: int, maps):
    part = Part("encoder", encoder, [features],
                [TensorSpec(ENCODER_STATES, [features.dims[0], Dim("frames"), encoder_dim], lengths=[1])], module=owner)
    maps["encoder"] = {"features": features.name, "outputs": ENCODER_STATES,
                       **({"features-size": features.onnx_names[1]} if features.lengths else {})}
    return ("encoder", PartModule(part, {}, "batch", False), list(part.inputs), list(part.outputs), {})


def fragment(folder: str, maps, layout: _Layout, start_labels: Sequence[int], encoder: bool) -> str:
    """The RASR config: ``state-managed-onnx`` alone (an LM) or as the decoder of ``encoder-decoder``."""
    lines = ["# label scorer written by onnx_compat.export_label_scorer(kind='state-managed') for RASR master "
             "(8fe741b1)", f"# state manager {layout.manager}; the search that uses it:",
             "#   lexiconfree-labelsync-beam-search (a context is scored once; the time-synchronous search scores "
             "a context again after blank, which the lstm manager cannot: its parent is dropped)"]
    lines += [f"# {note}" for note in layout.notes]
    lines.append(config.SECTION)
    pre = "decoder." if encoder else ""
    if encoder:
        lines += ["type = encoder-decoder", "encoder.type = onnx",
                  f"encoder.onnx-model.session.file = {os.path.join(folder, 'encoder.onnx')}"]
        lines += [f"encoder.onnx-model.io-map.{k} = {v}" for k, v in maps["encoder"].items()]
    lines.append(f"{pre}type = {managers.RASR_TYPE}")
    lines.append(f"{pre}onnx-model.session.file = {os.path.join(folder, 'scorer.onnx')}")
    lines += [f"{pre}onnx-model.io-map.{k} = {v}" for k, v in maps["scorer"].items()]
    lines.append(f"{pre}state-manager.type = {layout.manager}")
    if layout.max_history is not None:
        lines.append(f"{pre}state-manager.max-history = {layout.max_history}")
    lines.append(f"{pre}start-labels = {' '.join(str(s) for s in start_labels)}")
    return "\n".join(lines) + "\n"


def _export_graphs(graphs, folder: str, exporter, atol, rtol, seed, check: Callable, extra_files) -> PartsReport:
    """Each graph through ``export()`` into a temporary folder beside ``folder``; ``check`` on them all; then
    the files moved in. Nothing is written unless every graph verified and ``check`` passed."""
    from onnx_compat import export
    names = [g[0] for g in graphs]
    if not isinstance(exporter, str) and set(exporter) - set(names):
        raise LabelScorerError(f"exporter= names {sorted(set(exporter) - set(names))}; the graphs are {names}",
                               tensor="exporter", rule="exporter per graph")
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    report = PartsReport(folder)
    with tempfile.TemporaryDirectory(prefix=".state-managed-", dir=parent) as tmp:
        protos = {}
        for name, module, inputs, outputs, metadata in graphs:
            path = os.path.join(tmp, f"{name}.onnx")
            chosen = exporter if isinstance(exporter, str) else exporter.get(name, "auto")
            with preserved(module):
                try:
                    report.graphs[name] = export(module, path, inputs, outputs, exporter=chosen, atol=atol, rtol=rtol,
                                                 sizes=_own_sizes(inputs, SIZES) or None, seed=seed,
                                                 metadata=metadata, external_data=False)
                except Exception as exc:
                    exc.add_note(f"(while exporting graph {name!r})")
                    raise
            protos[name] = onnx.load(path)
        check(protos)
        for name, text in extra_files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        _move_into(tmp, folder, [f"{n}.onnx" for n in names] + list(extra_files), report)
    return report


def _proof(report: StateManagedReport, text: str, wrapper: StepGraph, input_names, outputs, encoder, feats, vocab,
           sentence_end: int, beam: int, max_labels: int) -> Callable:
    """The check run on the verified graphs before they are written: RASR's loader with the fragment as
    written, then the decodes and the batch of mixed prefix lengths."""
    flat_inputs = [n for names in input_names for n in names]
    output_names = [o.name for o in outputs]

    def rasr_loads_and_decodes(protos: Dict[str, onnx.ModelProto]) -> None:
        from onnx_compat.runtimes.session import open_session
        values = config.parse(text)
        pre = "decoder." if encoder is not None else ""
        selectors = {"scorer": pre + "onnx-model", "encoder": "encoder.onnx-model"}
        maps = {g: config.graph_settings(values, selectors[g])["io-map"] for g in protos}
        settings = managers.decoder_settings(values, pre)
        found = managers.findings(protos, maps, settings, vocab)
        if found:
            raise LabelScorerError("RASR's loader would refuse these graphs (or crash on them): " +
                                   "; ".join(str(f) for f in found), graph=found[0].graph, tensor=found[0].tensor,
                                   rule=found[0].rule)
        report.loader = ["scorer: validator, STATE_ variables, " + settings["state-manager.type"] +
                         " manager rules, start-labels, assumed rules"] + (["encoder: validator"] if encoder else [])
        variables = managers.state_variables(protos["scorer"])
        mgr = managers.manager(settings["state-manager.type"], variables, managers.max_history(settings))
        start, deferred = managers.parse_start_labels(settings), bool({"encoder-states", "encoder-states-size"}
                                                                      & set(maps["scorer"]))
        runs = (GraphRun(session_call(open_session(protos["scorer"])), maps["scorer"], variables),
                GraphRun(eager_call(wrapper, flat_inputs, output_names), maps["scorer"], variables))
        rasr = ManagedScorer(mgr, runs[0], start, deferred, rasr_quirks=True, rows=True)
        torch_side = ManagedScorer(mgr, runs[1], start, deferred, rasr_quirks=False)
        encoders = None
        if encoder is not None:
            encoders = (open_session(protos["encoder"]), maps["encoder"], encoder)
        report.decodes = _decodes(rasr, torch_side, runs, encoders, feats, beam, sentence_end, max_labels)
        report.notes += check_decoded(report.decodes)
        report.mixed_batch = mixed_batch(rasr, torch_side, vocab)
        report.row_max_abs_err, report.rows_checked = rasr.row_error, rasr.rows_checked

    return rasr_loads_and_decodes


def _encode(encoders, features: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    session, io_map, encoder = encoders
    feeds = {io_map["features"]: features}
    if "features-size" in io_map:
        feeds[io_map["features-size"]] = np.array([features.shape[1]], np.int32)
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    with torch.no_grad():
        mine, _ = encoder(torch.from_numpy(features), torch.tensor([features.shape[1]], dtype=torch.int32))
    return out[io_map["outputs"]], mine.numpy()


def _decodes(rasr, torch_side, runs, encoders, feats, beam, sentence_end, max_labels) -> List[dict]:
    """Greedy and beam through the graphs as RASR calls them and through the eager wrapper: same labels, costs
    within 1e-3 per label. An AED decodes each utterance up to two labels per encoder frame."""
    decodes = []
    for features in (feats if feats is not None else [None]):
        limit, frames = max_labels, None
        if features is not None:
            runs[0].enc, runs[1].enc = _encode(encoders, features)
            frames = runs[0].enc.shape[1]
            if runs[1].enc.shape[1] != frames:
                raise DecodeMismatch(f"the encoder graph gives {frames} frames, PyTorch {runs[1].enc.shape[1]}",
                                     graph="encoder", tensor="outputs", rule="decode as PyTorch")
            limit = max(1, math.ceil(2 * frames))
        for width in (1, beam):
            rasr.reset()
            torch_side.reset()
            got, want = label_sync(rasr, width, sentence_end, limit), label_sync(torch_side, width, sentence_end, limit)
            name = "greedy, label-synchronous" if width == 1 else f"beam {width}, label-synchronous"
            where = name + (f", {features.shape[1]} feature frames ({frames} encoder frames)" if frames else "")
            if got.labels != want.labels or abs(got.cost - want.cost) > 1e-3 * (1 + len(want.labels)):
                raise DecodeMismatch(f"{where}: the graph called as RASR calls it decodes {list(got.labels)} (cost "
                                     f"{got.cost:.6f}), PyTorch {list(want.labels)} (cost {want.cost:.6f})",
                                     graph="scorer", tensor="scores", rule="decode as PyTorch")
            entry = {"search": name, "labels": list(got.labels), "cost_onnx": round(got.cost, 6),
                     "cost_pytorch": round(want.cost, 6)}
            if features is not None:
                entry.update(feature_frames=int(features.shape[1]), encoder_frames=int(frames))
            decodes.append(entry)
    return decodes


def mixed_batch(rasr: ManagedScorer, torch_side: ManagedScorer, vocab: int, depth: int = 5) -> dict:
    """Hypotheses of prefix lengths 0 (a sibling of the start context, when its parent is kept), 1 ..
    ``depth`` scored in one run -- the time-synchronous search's batches -- each row checked against it alone
    inside ``rasr`` and against the eager wrapper's run of the same batch."""
    rows = []
    for scorer in (rasr, torch_side):
        scorer.reset()
        start = scorer.root()
        scorer.score([start])
        chain = [start]
        for i in range(depth - 1):
            chain.append(scorer.extend(chain[-1], 1 + i % max(1, vocab - 1)))
            scorer.score([chain[-1]])
        batch = [scorer.extend(c, (2 + i) % vocab) for i, c in enumerate(chain)]
        if start.parent is not None:
            batch.insert(0, Ctx(((3 % vocab),), start.parent))
        lengths = [len(c.parent.labels) for c in batch]
        rows.append((scorer.score(batch), lengths))
    err = float(np.abs(rows[0][0] - rows[1][0]).max())
    if err > 1e-3:
        raise DecodeMismatch(f"a batch of prefix lengths {rows[0][1]}: the graph's rows differ from PyTorch's by "
                             f"{err:.3g}", graph="scorer", tensor="scores", rule="decode as PyTorch")
    return {"prefix_lengths": rows[0][1], "max_abs_err_vs_pytorch": err, "rows_checked_alone": len(rows[0][1])}
