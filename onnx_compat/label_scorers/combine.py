"""Several label scorers in one search: RASR's ``combine`` of ``ScaledLabelScorer``s, written and proven.

``combine_label_scorers(folder, [(job, scale), ...])`` exports each scorer (``export_label_scorer``'s
arguments, each proven alone) into ``folder/scorer-<i>``, writes the fragment that puts them into one
search (``type = combine``, ``num-scorers``, each ``scorer-<i>.scale`` and the scorer's own keys under
``scorer-<i>.``; a CTC head is wrapped as ``ctc-prefix`` over it, ``scorer-<i>.ctc-scorer.*``), then decodes
with the combination -- each hypothesis' cost the sum of the scaled costs, RASR's rule
(``CombinedScoreAccessor``, ``ScaledScoreAccessor``) -- through the written graphs as RASR calls them,
the configuration read back from the fragment, against the same combined search over the PyTorch
callables, greedy and beam, label-synchronous (the AED path; one scorer holds the encoder: an AED). A
transducer first and LMs go to the time-synchronous search's ``num-label-scorers`` instead
(``combine_timesync.py``: ``combine`` would score blank by no one).

``CtcPrefix`` is RASR master's ``CtcPrefixLabelScorer`` (``8fe741b1``) over the per-frame CTC costs: a
label's cost is the prefix extended by it minus the prefix (both ``-log`` CTC prefix probabilities), the
sentence end's the whole prefix's probability at the last frame minus the prefix's.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import json

from onnx_compat.pipeline.files import write_text_atomically

from . import combine_timesync as timesync
from . import config, managers
from .errors import DecodeMismatch, LabelScorerError
from .proof import check_decoded
from .search import label_sync

FLOAT_MAX = float(np.finfo(np.float32).max)  # Core::Type<Score>::max: RASR's cost of an impossible label


@dataclass
class CombinationReport:
    folder: str
    config: str = ""
    scorers: List[dict] = field(default_factory=list)  # per scorer: its role, kind, scale, folder
    decodes: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what the combined proof could not show (one label decoded)
    timings: Dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


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


class Combined:
    """``combine``: contexts are tuples of the scorers' contexts; a row is the sum of the scaled rows."""

    def __init__(self, scorers: Sequence, scales: Sequence[float]) -> None:
        self.scorers, self.scales = list(scorers), list(scales)

    def encode(self, features: np.ndarray) -> int:
        return max(int(s.encode(features) or 0) for s in self.scorers)

    def root(self):
        return tuple(s.root() for s in self.scorers)

    def extend(self, ctx, label: int):
        return tuple(s.extend(c, label) for s, c in zip(self.scorers, ctx))

    def score(self, contexts, t: int = 0) -> np.ndarray:
        rows = [scale * np.asarray(s.score([c[i] for c in contexts], t), np.float64)
                for i, (s, scale) in enumerate(zip(self.scorers, self.scales))]
        return np.sum(rows, 0)


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


def combine_label_scorers(folder: str, scorers: Sequence[Tuple[Mapping, float]], *, beam: int = 4,
                          utterances: Optional[Sequence[int]] = None, seed: int = 0,
                          progress: Optional[Callable[[str], None]] = None) -> CombinationReport:
    """Export each ``(job, scale)`` (``export_label_scorer``'s keyword arguments; a ``kind="ctc"`` job becomes
    ``ctc-prefix``) into ``folder/scorer-<i>``, write ``folder/label-scorer.config`` combining them, and prove
    that the combined search through the written graphs decodes as the same combined search in PyTorch.
    ``progress``: told each scorer's stages (prefixed ``scorer-<i>``) and the combined proof."""
    from .api import export_label_scorer
    t0 = time.perf_counter()
    jobs = check_scorers(scorers)
    folder = os.path.abspath(folder)
    if os.path.exists(folder):  # before minutes of exports, not after them
        raise LabelScorerError(f"{folder} exists: a combination is written into a new folder", tensor="folder",
                               rule="new folder")
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    report = CombinationReport(folder)
    with tempfile.TemporaryDirectory(prefix=".combine-", dir=parent) as tmp:
        staged = os.path.join(tmp, "combination")
        reports = [export_label_scorer(os.path.join(staged, f"scorer-{i + 1}"),
                                       **(dict(job, progress=_prefixed(progress, f"scorer-{i + 1}")) if progress
                                          else job))
                   for i, (job, _) in enumerate(jobs)]
        if progress is not None:
            progress("the combined search through the graphs and in PyTorch")
        time_sync = timesync.is_time_sync(jobs)
        text = timesync.fragment(jobs, reports, folder, staged, beam) if time_sync else \
            fragment(jobs, reports, folder, staged)
        report.config = text
        report.scorers = [{"scorer": f"scorer-{i + 1}", "role": _role(job), "kind": job["kind"], "scale": scale,
                           "folder": os.path.join(folder, f"scorer-{i + 1}")} for i, (job, scale) in enumerate(jobs)]
        report.decodes = (timesync.prove if time_sync else prove)(text.replace(folder, staged), jobs, reports, beam,
                                                                  utterances, seed)
        report.notes = check_decoded(report.decodes)  # an all-empty combined proof is refused
        write_text_atomically(os.path.join(staged, "label-scorer.config"), text)
        report.timings["total"] = time.perf_counter() - t0
        write_text_atomically(os.path.join(staged, "report.json"), report.to_json() + "\n")
        if os.path.exists(folder):
            raise LabelScorerError(f"{folder} exists: a combination is written into a new folder", tensor="folder",
                                   rule="new folder")
        shutil.move(staged, folder)
    return report


def _prefixed(progress: Callable[[str], None], name: str) -> Callable[[str], None]:
    return lambda stage: progress(f"{name}: {stage}")


def _role(job: Mapping) -> str:
    if job["kind"] in timesync.TIME_SYNC:
        return "transducer"
    if job["kind"] == "ctc":
        return "ctc-prefix"
    return "lm" if job.get("encoder") is None else "aed"


def check_scorers(scorers) -> List[Tuple[dict, float]]:
    """The ``(job, scale)`` pairs as RASR can search with them, refused before any export: positive scales;
    for ``combine`` (label-synchronous) one AED, CTC heads and LMs, one sentence end; a transducer first and
    LMs over its vocabulary for the time-synchronous search's ``num-label-scorers`` (``combine_timesync``:
    ``combine`` would score blank by no one, its scorers' presets intersected)."""
    jobs = []
    for entry in scorers:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not isinstance(entry[0], Mapping):
            raise LabelScorerError(f"scorers holds {entry!r}; (export_label_scorer keyword arguments, scale) pairs",
                                   tensor="scorers", rule="(job, scale) pairs")
        job, scale = dict(entry[0]), entry[1]
        if job.get("kind") not in ("stateful", "state-managed", "ctc") + timesync.TIME_SYNC:
            raise LabelScorerError(f"kind={job.get('kind')!r}: a combination takes 'stateful' or 'state-managed' "
                                   "(an AED or an LM) and 'ctc' (as ctc-prefix) in the label-synchronous search, or "
                                   f"one of {timesync.TIME_SYNC} with LMs in the time-synchronous search",
                                   tensor="kind", rule="kinds combined")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
            raise LabelScorerError(f"scale {scale!r}: a positive number", tensor="scale", rule="scale")
        jobs.append((job, float(scale)))
    if timesync.is_time_sync(jobs):
        timesync.check(jobs)
        return jobs
    roles = [_role(j) for j, _ in jobs]
    if roles.count("aed") != 1:
        raise LabelScorerError(f"the scorers are {roles}: exactly one AED (a scorer with an encoder that is not a CTC "
                               "head) leads the label-synchronous search", tensor="scorers", rule="one AED")
    ends = {j.get("sentence_end") for j, _ in jobs if _role(j) != "ctc-prefix"}
    if len(ends) != 1:
        raise LabelScorerError(f"the scorers' sentence ends differ ({sorted(map(str, ends))}): the search has one "
                               "sentence-end label", tensor="sentence_end", rule="one sentence end")
    return jobs


def _sentence_end(jobs) -> int:
    return next(j["sentence_end"] for j, _ in jobs if _role(j) != "ctc-prefix")


def _labels(jobs) -> int:
    return next(len(j["vocabulary"]) for j, _ in jobs if _role(j) == "aed")


def fragment(jobs, reports, folder: str, staged: str) -> str:
    """``type = combine``: each scorer's own fragment under ``scorer-<i>.`` (a CTC head's under
    ``scorer-<i>.ctc-scorer.``, with ``blank-label-index`` and ``vocab-size``), its ``scale``."""
    lines = ["# label scorers combined by onnx_compat.combine_label_scorers for RASR master (8fe741b1): each "
             "hypothesis' cost is the sum of the scaled costs", "# the search that uses it:",
             f"#   lexiconfree-labelsync-beam-search, sentence-end-label-index = {_sentence_end(jobs)}",
             config.SECTION, "type = combine", f"num-scorers = {len(jobs)}"]
    for i, ((job, scale), rep) in enumerate(zip(jobs, reports)):
        pre = f"scorer-{i + 1}."
        lines.append(f"{pre}scale = {scale!r}")
        values = config.parse(rep.config.replace(staged, folder))
        if _role(job) == "ctc-prefix":
            lines += [f"{pre}type = ctc-prefix", f"{pre}blank-label-index = {job['blank']}",
                      f"{pre}vocab-size = {len(job['vocabulary'])}"]
            pre += "ctc-scorer."
        lines += [f"{pre}{key} = {value}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _sub(values: Mapping[str, str], prefix: str) -> Dict[str, str]:
    return {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}


def _rasr_member(values: Mapping[str, str], role: str, kind: str, eos: int, labels: int):
    """One scorer of the combination over its written graphs, configured from the fragment as written."""
    from .backends import RasrEmulator
    if role == "ctc-prefix":
        inner = RasrEmulator("ctc", _sub(values, "ctc-scorer."), rows=False)
        return CtcPrefix(inner, int(values["blank-label-index"]), int(values["vocab-size"]), eos, labels)
    if kind == "stateful":
        return RasrEmulator("stateful", values)
    return _managed_member(values, role)


def _managed_member(values, role):
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


def _torch_member(job: Mapping, rep, role: str, eos: int, labels: int):
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


def prove(text: str, jobs, reports, beam: int, utterances, seed: int) -> List[dict]:
    """The combined search (greedy and ``beam``) over the written graphs and over PyTorch: same labels, costs
    (the sums of scaled costs) within 1e-3 per label, on every utterance the AED's proof decoded."""
    values = config.parse(text)
    eos, labels = _sentence_end(jobs), _labels(jobs)
    scales = [scale for _, scale in jobs]
    rasr = Combined([_rasr_member(_sub(values, f"scorer-{i + 1}."), _role(job), job["kind"], eos, labels)
                     for i, (job, _) in enumerate(jobs)], scales)
    torch_side = Combined([_torch_member(job, rep, _role(job), eos, labels) for (job, _), rep in zip(jobs, reports)],
                          scales)
    aed = next(rep for (job, _), rep in zip(jobs, reports) if _role(job) == "aed")
    lengths = utterances or sorted({d["feature_frames"] for d in aed.decodes})
    gen = np.random.default_rng(seed)
    width = next(j for j, _ in jobs if _role(j) == "aed")["features"].dims[2]
    decodes = []
    for n in lengths:
        features = gen.standard_normal((1, n, width)).astype(np.float32)
        frames = rasr.encode(features)
        if torch_side.encode(features) != frames:
            raise DecodeMismatch(f"{n} feature frames: the graphs give {frames} encoder frames, PyTorch another count",
                                 graph="encoder", tensor="outputs", rule="decode as PyTorch")
        for width_ in (1, beam):
            limit = max(1, math.ceil(2 * frames))
            got, want = label_sync(rasr, width_, eos, limit), label_sync(torch_side, width_, eos, limit)
            name = "greedy" if width_ == 1 else f"beam {width_}"
            if got.labels != want.labels or abs(got.cost - want.cost) > 1e-3 * (1 + len(want.labels)):
                raise DecodeMismatch(f"combined {name} search, {n} feature frames: the graphs decode "
                                     f"{list(got.labels)} (cost {got.cost:.6f}), PyTorch {list(want.labels)} (cost "
                                     f"{want.cost:.6f})", graph="scorer", tensor="scores", rule="decode as PyTorch")
            decodes.append({"feature_frames": n, "encoder_frames": frames, "search": f"{name}, label-synchronous",
                            "labels": list(got.labels), "cost_onnx": round(got.cost, 6),
                            "cost_pytorch": round(want.cost, 6)})
    return decodes
