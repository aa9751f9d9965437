"""``kind="state-managed"``: RASR's ``state-managed-onnx`` label scorer, one graph whose states RASR manages.

For what the other kinds cannot carry: a Transformer decoder's self-attention cache grows with the label
history, so RASR's ``transformer`` state manager holds one position per label and hands the graph every
ancestor's, stacked on the one symbolic dim and left-padded with zeros to the longest prefix of the batch;
the ``lstm`` manager holds ``[S]`` rows, zeros first. The user writes the step in PyTorch's terms; the
wrapper here makes it the graph RASR calls (int32 ``token [B, S]`` and its lengths, ``prefix-length``, the
batch-1 encoder states repeated to the hypotheses, costs ``[B, S, V]``, the ``STATE_`` metadata).

Flow: arguments checked -> the step rehearsed in eager PyTorch (zero-length prefix, a longer one, which
layout the states come back in; every graph input used) -> the graphs exported and verified at new shapes
by ``export()`` into a temporary folder (``managed_graph.py``) -> RASR's loader emulated with the config
fragment as written (``managers.findings``) -> the decode proof through the graphs as RASR calls them
against the same search over the eager wrapper, and a batch of hypotheses of different prefix lengths,
row by row against each alone (``managed_proof.py``) -> the folder.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from onnx_compat.pipeline.adapter import flatten
from onnx_compat.spec import Dim, TensorSpec

from . import config, managers
from .checks import _check_features, check_scores, weights_owner
from .errors import LabelScorerError
from .graphs import ENCODER_STATES, FRAMES_EXAMPLE, Callables
from .managed_graph import StepGraph, check_inputs_used, earlier_files, encoder_graph, export_graphs, finish, specs
from .managed_proof import proof as make_proof
from .rehearsal import check_eval_mode, utterance_lengths
from .reports import CONFIG_FILE, StateManagedReport

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
    owner = module or weights_owner(*(f for f in (score, encoder) if f is not None))
    check_eval_mode(owner)
    folder = config.check_value(os.path.abspath(folder), "folder")
    earlier = earlier_files(folder, {"scorer.onnx"} | ({"encoder.onnx"} if encoder is not None else set()))
    sign = -1.0 if scores == "log-probs" else 1.0
    tell("rehearsing the step in PyTorch")
    uses_length = _rehearse(layout, score, states, batch, vocabulary, scores, encoder, features, encoder_dim, seed)
    wrapper = StepGraph(score, owner, layout.flavour, len(states), encoder is not None, uses_length, sign)
    inputs, outputs, maps = specs(layout, states, batch, len(vocabulary), encoder_dim, uses_length,
                                   _suffix_out(layout, score, states, batch, encoder, encoder_dim))
    check_inputs_used(wrapper, inputs, seed, zeroed={"token_length", maps["scorer"].get("prefix-length")}
                      if layout.flavour != "cache" else set())
    metadata = {managers.STATE_PREFIX + f"{s.name}_in": f"{s.name}_out" for s in states}
    graphs = [("scorer", wrapper, inputs, outputs, metadata)]
    if encoder is not None:
        graphs.insert(0, encoder_graph(encoder, owner, features, encoder_dim, maps))
    text = fragment(folder, maps, layout, start_labels, encoder is not None)
    report = StateManagedReport(folder, "state-managed", managers.RASR_TYPE, "master", config=text,
                                uses_encoder_lengths={"scorer": uses_length} if encoder is not None else {},
                                manager=layout.manager, layout=layout.flavour, notes=list(layout.notes))
    feats = None if encoder is None else _utterances(encoder, score, owner, features, utterances, seed)
    report.eager = EagerSide(wrapper, [n for s in inputs for n in s.onnx_names], [o.name for o in outputs], encoder)
    proof = make_proof(report, text, wrapper, [s.onnx_names for s in inputs], outputs, encoder, feats, len(vocabulary),
                   sentence_end, beam, max_labels)
    tell(f"exporting {', '.join(g[0] for g in graphs)}; then RASR's loader and the decode proof")
    parts = export_graphs(graphs, folder, exporter, atol, rtol, seed, proof, {CONFIG_FILE: text})
    finish(report, parts, earlier, t0)
    return report


def _utterances(encoder, score, owner, features, utterances, seed) -> List[np.ndarray]:
    """The feature sequences an AED's proof decodes ([1, T, F] each, drawn with ``seed``), at the lengths
    ``utterances`` asks for or the default ones (``rehearsal.utterance_lengths``)."""
    gen = np.random.default_rng(seed)
    lengths = utterance_lengths(Callables(encoder, score, module=owner), features, utterances, FRAMES_EXAMPLE)
    return [gen.standard_normal((1, n, features.dims[2])).astype(np.float32) for n in lengths]


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
    if encoder is not None and len(list(start_labels)) > 1:
        raise LabelScorerError(f"start_labels={list(start_labels)} with encoder states: RASR defers each start "
                               "context until the features are in, then scores the last one, whose parent was "
                               "never scored (a null state: undefined behaviour); give one start label",
                               tensor="start_labels", rule="no undefined behaviour in RASR")
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
