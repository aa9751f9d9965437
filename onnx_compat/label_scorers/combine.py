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

Each member of the combination, over its graphs or over PyTorch (``CtcPrefix``, RASR's ``ctc-prefix``,
included), is built in ``combine_members.py``, which the time-synchronous proof shares.
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
from . import config
from .combine_members import CtcPrefix, managed_member, torch_member
from .errors import DecodeMismatch, LabelScorerError
from .proof import check_decoded
from .search import label_sync

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
    return managed_member(values, role)


def prove(text: str, jobs, reports, beam: int, utterances, seed: int) -> List[dict]:
    """The combined search (greedy and ``beam``) over the written graphs and over PyTorch: same labels, costs
    (the sums of scaled costs) within 1e-3 per label, on every utterance the AED's proof decoded."""
    values = config.parse(text)
    eos, labels = _sentence_end(jobs), _labels(jobs)
    scales = [scale for _, scale in jobs]
    rasr = Combined([_rasr_member(_sub(values, f"scorer-{i + 1}."), _role(job), job["kind"], eos, labels)
                     for i, (job, _) in enumerate(jobs)], scales)
    torch_side = Combined([torch_member(job, rep, _role(job), eos, labels) for (job, _), rep in zip(jobs, reports)],
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
