"""``kind="full-context"``: RASR's ``full-context-onnx`` (open PR #241, head ``cb96aaf9``), opt-in with ``release=``.

Stateless: every call gets each hypothesis' whole label history, ``history`` int32 ``[B, L]`` right-padded
with zeros to the longest of the batch and starting with ``start-label-index``, and its true lengths
``history-size`` ``[B]``; with an encoder, the batch-1 encoder states ``[1, T', E]`` and their size. The
graph returns costs ``[B, V]`` for the label after each history, so it must ignore the padding. The user
writes ``score(history [B, L], lengths [B], [frames [B, T', E], lengths [B]]) -> log_probs [B, V]``.

The proof decodes greedy and beam through the graph as the PR calls it (a context is its label sequence;
its scores cached by it) against the same search over the eager wrapper, and runs histories of lengths 1 to
6 in one batch, each row against that history alone (a graph that reads the right padding fails).
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
import torch

from onnx_compat.runtimes.compare import closeness
from onnx_compat.spec import Dim, TensorSpec

from . import config
from .checks import _check_features, check_scores, weights_owner
from .errors import DecodeMismatch, LabelScorerError
from .graphs import ENCODER_STATES, FRAMES_EXAMPLE, Callables
from .loader import Finding, validator
from .managed_search import eager_call, session_call
from .rasr_specs import ENCODER, F32, I32, Entry
from .rehearsal import utterance_lengths
from .search import label_sync
from .proof import check_decoded
from .rehearsal import check_eval_mode
from .managed_graph import earlier_files, encoder_graph, export_graphs, finish
from .managed_proof import encode
from .reports import CONFIG_FILE, StateManagedReport

RASR_TYPE, RELEASE = "full-context-onnx", "full-context-pr"
RELEASE_TEXT = "RASR with the open full-context PR #241 (cb96aaf9)"
SPEC = (Entry("input-feature", "in", True, (F32,), ((-1, -2), (1, -2))),
        Entry("encoder-states", "in", True, (F32,), ((1, -1, -2), (-1, -1, -2))),
        Entry("encoder-states-size", "in", True, (I32,), ((1,), (-1,))),
        Entry("history", "in", False, (I32,), ((-1, -2),)),
        Entry("history-size", "in", False, (I32,), ((1,), (-1,))),
        Entry("scores", "out", False, (F32,), ((-1, -2),)))


class HistoryGraph(torch.nn.Module):
    """The user's callable as the graph the PR calls: int32 history and sizes, batch-1 encoder states
    repeated to the hypotheses, costs."""

    def __init__(self, score: Callable, owner, encoder: bool, encoder_lengths: bool, sign: float) -> None:
        super().__init__()
        self.score, self.owner, self.encoder, self.encoder_lengths, self.sign = score, owner, encoder, \
            encoder_lengths, sign

    def forward(self, history, history_size, *rest):
        enc_args = ()
        if self.encoder:
            enc = rest[0]
            lengths = rest[1] if self.encoder_lengths else torch.ones(1, dtype=torch.int32) * enc.shape[1]
            enc_args = (enc.expand(history.shape[0], -1, -1), lengths.long().expand(history.shape[0]))
        return self.sign * self.score(history.long(), history_size.long(), *enc_args)


def export_full_context(folder: str, *, score: Callable, vocabulary: Sequence[str], sentence_end: int,
                        start_label: int = 0, encoder: Optional[Callable] = None, features: Optional[TensorSpec] = None,
                        encoder_dim: Optional[int] = None, scores: str = "log-probs", batch: str = "hyps",
                        module: Optional[torch.nn.Module] = None, exporter="auto", utterances=None,
                        max_labels: int = 20, beam: int = 4, atol: float = 1e-4, rtol: float = 1e-3, seed: int = 0,
                        progress: Optional[Callable[[str], None]] = None) -> StateManagedReport:
    """Write ``score`` as ``full-context-onnx`` (an LM, or with the encoder an ``encoder-decoder``'s decoder)
    into ``folder``; prove it by decoding; return the report (``manager`` empty, ``layout`` ``"history"``)."""
    t0 = time.perf_counter()
    tell = progress or (lambda stage: None)
    _checked(vocabulary, sentence_end, start_label, encoder, features, encoder_dim, scores)
    owner = module or weights_owner(*(f for f in (score, encoder) if f is not None))
    check_eval_mode(owner)
    folder = config.check_value(os.path.abspath(folder), "folder")
    earlier = earlier_files(folder, {"scorer.onnx"} | ({"encoder.onnx"} if encoder is not None else set()))
    tell("rehearsing the callable in PyTorch")
    uses_length = _rehearse(score, vocabulary, scores, encoder, encoder_dim, start_label)
    wrapper = HistoryGraph(score, owner, encoder is not None, uses_length, -1.0 if scores == "log-probs" else 1.0)
    hyps = Dim(batch)
    inputs = [TensorSpec("history", [hyps, Dim("history")], torch.int32, lengths=[1], values=(0, len(vocabulary)))]
    io_map = {"history": "history", "history-size": "history:size1", "scores": "scores"}
    maps = {"scorer": io_map}
    if encoder is not None:
        inputs.append(TensorSpec(ENCODER_STATES, [1, Dim("frames"), encoder_dim], lengths=[1] if uses_length else []))
        io_map["encoder-states"] = ENCODER_STATES
        if uses_length:
            io_map["encoder-states-size"] = f"{ENCODER_STATES}:size1"
    outputs = [TensorSpec("scores", [hyps, len(vocabulary)])]
    graphs = [("scorer", wrapper, inputs, outputs, {})]
    if encoder is not None:
        graphs.insert(0, encoder_graph(encoder, owner, features, encoder_dim, maps))
    text = fragment(folder, maps, start_label, encoder is not None)
    report = StateManagedReport(folder, "full-context", RASR_TYPE, RELEASE, config=text, layout="history",
                                uses_encoder_lengths={"scorer": uses_length} if encoder is not None else {})
    feats = None
    if encoder is not None:
        gen = np.random.default_rng(seed)
        feats = [gen.standard_normal((1, n, features.dims[2])).astype(np.float32)
                 for n in utterance_lengths(Callables(encoder, score, module=owner), features, utterances,
                                            FRAMES_EXAMPLE)]
    names = [n for s in inputs for n in s.onnx_names]
    proof = _proof(report, text, wrapper, names, encoder, feats, len(vocabulary), sentence_end, beam, max_labels)
    tell(f"exporting {', '.join(g[0] for g in graphs)}; then the loader and the decode proof")
    parts = export_graphs(graphs, folder, exporter, atol, rtol, seed, proof, {CONFIG_FILE: text})
    finish(report, parts, earlier, t0)
    return report


def _checked(vocabulary, sentence_end, start_label, encoder, features, encoder_dim, scores) -> None:
    if scores not in ("log-probs", "costs"):
        raise LabelScorerError(f"scores={scores!r}; 'log-probs' or 'costs'", tensor="scores", rule="score convention")
    if not isinstance(vocabulary, (list, tuple)) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
        raise LabelScorerError("vocabulary must be a non-empty list of label strings (the lexicon's order)",
                               tensor="vocabulary", rule="vocabulary")
    for name, value in (("sentence_end", sentence_end), ("start_label", start_label)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(vocabulary):
            raise LabelScorerError(f"{name}={value!r}: a label id in 0..{len(vocabulary) - 1}", tensor=name,
                                   rule=f"{name} id")
    if encoder is not None:
        _check_features(features)
        if not isinstance(encoder_dim, int) or encoder_dim < 1:
            raise LabelScorerError(f"encoder_dim={encoder_dim!r}: the encoder frames' size", graph="encoder",
                                   tensor="encoder_dim", rule="encoder frames [B, T', E]")


def _rehearse(score, vocabulary, convention, encoder, encoder_dim, start_label) -> bool:
    """The callable on three right-padded histories: ``[B, V]`` float32 costs or log-probs as declared; each
    row unchanged when the padding changes (refused here, before the export, when it is not); whether it
    reads the encoder lengths."""
    hyps, vocab = 3, len(vocabulary)
    history = torch.tensor([[start_label, 1, 2, 0], [start_label, 0, 0, 0], [start_label, 3, 0, 0]]) % vocab
    lengths = torch.tensor([3, 1, 2])
    enc_args = () if encoder is None else (torch.randn(hyps, 5, encoder_dim), torch.full((hyps,), 5))
    with torch.no_grad():
        out = score(history, lengths, *enc_args)
        check_scores(out, hyps, vocabulary, convention)
        padded = torch.where(torch.arange(4)[None] < lengths[:, None], history, (history + 1) % vocab)
        other = score(padded, lengths, *enc_args)
        if not closeness(other, out, atol=1e-5, rtol=1e-5).ok:
            raise LabelScorerError("the scores change when the history's padding changes: full-context-onnx "
                                   "right-pads shorter histories with zeros; mask the positions at and after "
                                   "history-size", graph="scorer", tensor="history", rule="padding ignored")
        if encoder is None:
            return False
        shorter = score(history, lengths, enc_args[0], enc_args[1] - 1)
    return not torch.equal(out, shorter)


def fragment(folder: str, maps, start_label: int, encoder: bool) -> str:
    lines = [f"# label scorer written by onnx_compat.export_label_scorer(kind='full-context') for {RELEASE_TEXT}",
             "# the search that uses it: lexiconfree-labelsync-beam-search", config.SECTION]
    pre = "decoder." if encoder else ""
    if encoder:
        lines += ["type = encoder-decoder", "encoder.type = onnx",
                  f"encoder.onnx-model.session.file = {os.path.join(folder, 'encoder.onnx')}"]
        lines += [f"encoder.onnx-model.io-map.{k} = {v}" for k, v in maps["encoder"].items()]
    lines += [f"{pre}type = {RASR_TYPE}", f"{pre}onnx-model.session.file = {os.path.join(folder, 'scorer.onnx')}"]
    lines += [f"{pre}onnx-model.io-map.{k} = {v}" for k, v in maps["scorer"].items()]
    lines.append(f"{pre}start-label-index = {start_label}")
    return "\n".join(lines) + "\n"


def findings(graphs: Mapping[str, onnx.ModelProto], maps, vocabulary: int) -> List[Finding]:
    """The PR's loader: ``IOValidator`` with its spec (``history-size``, not i6's ``history-length``), every
    graph input fed, the scores as wide as the vocabulary."""
    found = validator("encoder", graphs["encoder"], maps["encoder"], ENCODER) if "encoder" in graphs else []
    proto, io_map = graphs["scorer"], maps["scorer"]
    found += validator("scorer", proto, io_map, SPEC)
    found += [Finding("scorer", i.name, "every input fed", f"input {i.name!r} is not mapped in io-map: RASR never "
                      "feeds it") for i in proto.graph.input if i.name not in set(io_map.values())]
    out = {o.name: o for o in proto.graph.output}.get(io_map.get("scores", ""))
    dims = [d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim] if out else []
    if dims and dims[-1] is not None and dims[-1] != vocabulary:  # a symbolic width is read in the proof
        found.append(Finding("scorer", out.name, "scores as wide as the vocabulary", f"scores have {dims[-1]} "
                             f"columns, the vocabulary {vocabulary} labels"))
    return found


class HistoryScorer:
    """``FullContextOnnxLabelScorer``'s calls: a context is its label sequence (the start label first); the
    uncached ones of a call run as one batch, right-padded with zeros; with ``rows`` each row is compared
    with its history run alone."""

    def __init__(self, call: Callable, io_map: Mapping[str, str], start_label: int, width: int, rows: bool = False,
                 atol: float = 1e-5) -> None:
        self.call, self.io_map, self.start, self.rows, self.atol = call, io_map, start_label, rows, atol
        self.width = width
        self.enc: Optional[np.ndarray] = None
        self.cache: Dict[tuple, np.ndarray] = {}
        self.row_error, self.rows_checked = 0.0, 0

    def root(self) -> tuple:
        self.cache.clear()
        return (self.start,)

    def extend(self, ctx: tuple, label: int) -> tuple:
        return ctx + (label,)

    def score(self, contexts: Sequence[tuple], t: int = 0) -> np.ndarray:
        todo = list(dict.fromkeys(c for c in contexts if c not in self.cache))
        if todo:
            rows = self._run(todo)
            if self.rows and len(todo) > 1:
                self._check_rows(todo, rows)
            self.cache.update(zip(todo, rows))
        return np.stack([self.cache[c] for c in contexts])

    def _run(self, histories: Sequence[tuple]) -> np.ndarray:
        m = self.io_map
        longest = max(len(h) for h in histories)
        history = np.zeros((len(histories), longest), np.int32)
        for b, h in enumerate(histories):
            history[b, :len(h)] = h
        feeds = {m["history"]: history, m["history-size"]: np.array([len(h) for h in histories], np.int32)}
        if "encoder-states" in m:
            feeds[m["encoder-states"]] = self.enc
        if "encoder-states-size" in m:
            feeds[m["encoder-states-size"]] = np.array([self.enc.shape[1]], np.int32)
        scores = self.call(feeds)[m["scores"]]
        if scores.ndim != 2 or scores.shape[0] != len(histories) or scores.shape[1] != self.width:
            raise LabelScorerError(f"scores came back {list(scores.shape)} for {len(histories)} histories; RASR reads "
                                   f"[B, V] with V = {self.width}, the vocabulary", graph="scorer", tensor=m["scores"],
                                   rule="scores as wide as the vocabulary")
        return scores

    def _check_rows(self, histories, rows) -> None:
        self.rows_checked += len(histories)
        for h, row in zip(histories, rows):
            close = closeness(row[None], self._run([h]), self.atol, 0.0)
            self.row_error = max(self.row_error, close.max_abs_err)
            if not close.ok:
                raise LabelScorerError(f"history {list(h)} in a batch of lengths {[len(x) for x in histories]} "
                                       f"differs from it alone by {close.max_abs_err:.3g}: the graph reads the zeros "
                                       "the PR right-pads shorter histories with", graph="scorer", tensor="scores",
                                       rule="rows independent of the batch's padding")


def _proof(report, text, wrapper, input_names, encoder, feats, vocab, sentence_end, beam, max_labels) -> Callable:
    def loads_and_decodes(protos: Dict[str, onnx.ModelProto]) -> None:
        from onnx_compat.runtimes.session import open_session
        values = config.parse(text)
        pre = "decoder." if encoder is not None else ""
        selectors = {"scorer": pre + "onnx-model", "encoder": "encoder.onnx-model"}
        maps = {g: config.graph_settings(values, selectors[g])["io-map"] for g in protos}
        found = findings(protos, maps, vocab)
        if found:
            raise LabelScorerError("RASR's loader (PR #241) would refuse these graphs: " + "; ".join(map(str, found)),
                                   graph=found[0].graph, tensor=found[0].tensor, rule=found[0].rule)
        report.loader = ["scorer: validator (PR #241 spec), every input fed, scores' width"] + \
            (["encoder: validator"] if encoder else [])
        start = int(values[pre + "start-label-index"])
        rasr = HistoryScorer(session_call(open_session(protos["scorer"])), maps["scorer"], start, vocab, rows=True)
        mine = HistoryScorer(eager_call(wrapper, input_names, ["scores"]), maps["scorer"], start, vocab)
        encoders = (open_session(protos["encoder"]), maps["encoder"], encoder) if encoder is not None else None
        report.decodes = _decodes(rasr, mine, encoders, feats, beam, sentence_end, max_labels)
        report.notes += check_decoded(report.decodes)
        report.mixed_batch = _mixed(rasr, mine, vocab, start)
        report.row_max_abs_err, report.rows_checked = rasr.row_error, rasr.rows_checked
    return loads_and_decodes


def _decodes(rasr, mine, encoders, feats, beam, sentence_end, max_labels) -> List[dict]:
    decodes = []
    for features in (feats if feats is not None else [None]):
        limit, frames = max_labels, None
        if features is not None:
            rasr.enc, mine.enc = encode(encoders, features)
            frames = rasr.enc.shape[1]
            limit = max(1, math.ceil(2 * frames))
        for width in (1, beam):
            got, want = label_sync(rasr, width, sentence_end, limit), label_sync(mine, width, sentence_end, limit)
            name = "greedy, label-synchronous" if width == 1 else f"beam {width}, label-synchronous"
            if got.labels != want.labels or abs(got.cost - want.cost) > 1e-3 * (1 + len(want.labels)):
                raise DecodeMismatch(f"{name}: the graph decodes {list(got.labels)} (cost {got.cost:.6f}), PyTorch "
                                     f"{list(want.labels)} (cost {want.cost:.6f})", graph="scorer", tensor="scores",
                                     rule="decode as PyTorch")
            entry = {"search": name, "labels": list(got.labels), "cost_onnx": round(got.cost, 6),
                     "cost_pytorch": round(want.cost, 6)}
            if features is not None:
                entry.update(feature_frames=int(features.shape[1]), encoder_frames=int(frames))
            decodes.append(entry)
    return decodes


def _mixed(rasr: HistoryScorer, mine: HistoryScorer, vocab: int, start: int, depth: int = 6) -> dict:
    """Histories of lengths 1..``depth`` in one run, each row against it alone and against PyTorch."""
    histories = [(start,) + tuple((2 + i + k) % vocab for k in range(i)) for i in range(depth)]
    rows = []
    for scorer in (rasr, mine):
        scorer.root()  # a new segment: the cache cleared
        rows.append(scorer.score(histories))
    err = float(np.abs(rows[0] - rows[1]).max())
    if err > 1e-3:
        raise DecodeMismatch(f"histories of lengths 1..{depth} in one batch differ from PyTorch's by {err:.3g}",
                             graph="scorer", tensor="scores", rule="decode as PyTorch")
    return {"history_lengths": [len(h) for h in histories], "max_abs_err_vs_pytorch": err}
