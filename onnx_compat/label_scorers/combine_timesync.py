"""Transducer + LM: several label scorers in RASR's time-synchronous search, written and proven.

RASR's ``combine`` cannot hold a transducer with an LM: ``CombineLabelScorer`` enables the transitions
every scorer enables, and the transducer's and the ``lm`` preset share no blank transition. The search
itself takes several scorers (read from RASR berger_dev ``c44ad3e7``, the branch holding the transducer's
PR #149, and master ``8fe741b1``, which has the same search): ``ModelCombination`` builds
``num-label-scorers`` of them from ``label-scorer-<i>`` (``src/Speech/ModelCombination.cc`` 34-35, 79-83),
each a ``ScaledLabelScorer`` (``scale``; it keeps its scorer's transitions, ``ScaledLabelScorer.cc``
65-70); ``LexiconfreeTimesyncBeamSearch::decodeStep`` adds each scorer's cost to an extension only for
the transitions that scorer scores (``LexiconfreeTimesyncBeamSearch.cc`` 478-482 for the first, 504 for
the others), prunes to ``max-beam-size[i]`` after each scorer but the last (530-536), and extends a
scorer's context only on a transition it scores (578-589; master's ``StateManagedOnnxLabelScorer``
keeps its context on blank too, its ``extendedScoringContext`` 198-220). The ``lm`` preset scores
``INITIAL_LABEL``, ``LABEL_TO_LABEL``, ``BLANK_TO_LABEL``, ``SENTENCE_END``; the transducer's every
label and blank transition (``TransitionTypes.cc`` 85-98). So a hypothesis' cost is the transducer's
scaled cost of every symbol plus the LM's scaled cost of every label, blank costing the LM nothing and
leaving its context as it was.

``fragment`` writes that: ``num-label-scorers`` and one ``[*.label-scorer-<i>]`` section per scorer with
its ``scale`` and its own keys. ``prove`` decodes with it, the configuration read back from the text,
through the written graphs as RASR calls them (``backends.RasrEmulator`` for the transducer,
``managed_search`` for the LM) against the same combined search over the PyTorch callables: greedy and
beam, labels staying on or consuming the frame, every utterance the transducer's own proof decoded. The
first ``max-beam-size`` written is large enough to prune nothing before the LM's cost is added (the
emulated search prunes once per step); no sentence end is scored (the search's
``sentence-end-label-index`` is left unset: ``finalizeHypotheses`` returns at once, 878-881).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from . import config
from .combine_members import managed_member, torch_member
from .errors import DecodeMismatch, LabelScorerError
from .proof import searches
from .search import time_sync

TIME_SYNC = ("transducer", "fixed-context")
RELEASE_TEXT = {"transducer": "RASR berger_dev c44ad3e7 (the stateful-transducer PR #149)",
                "fixed-context": "RASR master (8fe741b1)"}


def is_time_sync(jobs) -> bool:
    return any(job.get("kind") in TIME_SYNC for job, _ in jobs)


def check(jobs) -> None:
    """One transducer (the scorer with the encoder, first) and LMs (``kind="state-managed"`` without an
    encoder) over one vocabulary; refused before any export."""
    kinds = [job.get("kind") for job, _ in jobs]
    if kinds[0] not in TIME_SYNC or any(k in TIME_SYNC for k in kinds[1:]):
        raise LabelScorerError(f"the scorers' kinds are {kinds}: a time-synchronous combination is one transducer "
                               f"({' or '.join(TIME_SYNC)}) first, then LMs", tensor="scorers",
                               rule="one transducer first")
    for job, _ in jobs[1:]:
        if job.get("kind") != "state-managed" or job.get("encoder") is not None:
            raise LabelScorerError(f"kind={job.get('kind')!r} with {'an' if job.get('encoder') else 'no'} encoder "
                                   "beside a transducer: its other scorers are LMs (kind='state-managed', no "
                                   "encoder), scored on label transitions only (RASR's lm preset)", tensor="kind",
                                   rule="LMs beside a transducer")
    sizes = [len(job["vocabulary"]) for job, _ in jobs]
    if len(set(sizes)) != 1:
        raise LabelScorerError(f"the scorers' vocabularies have {sizes} labels: RASR indexes every scorer's row by "
                               "the one lexicon's lemma ids", tensor="vocabulary", rule="one vocabulary")


def fragment(jobs, reports, folder: str, staged: str, beam: int) -> str:
    kind, blank = jobs[0][0]["kind"], jobs[0][0]["blank"]
    vocab = len(jobs[0][0]["vocabulary"])
    sizes = ", ".join([str(beam * vocab)] * (len(jobs) - 1) + [str(beam)])
    lines = [f"# label scorers combined by onnx_compat.combine_label_scorers for {RELEASE_TEXT[kind]}: "
             "RASR's time-synchronous search over several label scorers, each hypothesis' cost the sum of the "
             "scaled costs of the transitions each scorer scores (the LMs: labels only)",
             "# the search that uses it:", f"#   lexiconfree-timesync-beam-search, blank-label-index = {blank}, "
             "no sentence-end-label-index",
             f"#   max-beam-size = {sizes} (one per scorer: the first prunes nothing before the LMs are added, "
             "as proven)", "[*]", f"num-label-scorers = {len(jobs)}"]
    for i, ((_, scale), rep) in enumerate(zip(jobs, reports)):
        lines += [f"[*.label-scorer-{i + 1}]", f"scale = {scale!r}"]
        lines += [f"{key} = {value}" for key, value in config.parse(rep.config.replace(staged, folder)).items()]
    return "\n".join(lines) + "\n"


def sections(text: str) -> Dict[str, Dict[str, str]]:
    """``{section: {key: value}}`` of a fragment, as RASR reads it (comments dropped)."""
    out: Dict[str, Dict[str, str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("["):
            current = out.setdefault(line, {})
        elif line and "=" in line and current is not None:
            key, value = (part.strip() for part in line.split("=", 1))
            current[key] = value
    return out


class TimeSynchronous:
    """The search's view of several scorers: a context is one per scorer; a row is the sum of the scaled
    rows, the LMs' blank column left out (no transition into blank is in the lm preset); a label extends
    every scorer's context (both presets score every label transition), blank none (``time_sync`` keeps
    the context on blank)."""

    def __init__(self, scorers: Sequence, scales: Sequence[float], blank: int) -> None:
        self.scorers, self.scales, self.blank = list(scorers), list(scales), blank

    def encode(self, features: np.ndarray) -> int:
        frames = self.scorers[0].encode(features)
        for lm in self.scorers[1:]:
            lm.encode(features)
        return frames

    def root(self):
        return tuple(s.root() for s in self.scorers)

    def extend(self, ctx, label: int):
        return tuple(s.extend(c, label) for s, c in zip(self.scorers, ctx))

    def score(self, contexts, t: int) -> np.ndarray:
        total = self.scales[0] * np.asarray(self.scorers[0].score([c[0] for c in contexts], t), np.float64)
        for i, (lm, scale) in enumerate(zip(self.scorers[1:], self.scales[1:]), 1):
            row = scale * np.asarray(lm.score([c[i] for c in contexts], t), np.float64)
            row[:, self.blank] = 0.0
            total = total + row
        return total


def _members(text: str, jobs, reports):
    """(the scorers over the graphs, configured from ``text`` as written; the same over PyTorch; scales)."""
    from .backends import RasrEmulator, TorchCallables
    parts = sections(text)
    count = int(parts["[*]"]["num-label-scorers"])
    if count != len(jobs):
        raise LabelScorerError(f"num-label-scorers = {count} for {len(jobs)} scorers", tensor="num-label-scorers",
                               rule="num-label-scorers")
    values = [parts[f"[*.label-scorer-{i + 1}]"] for i in range(count)]
    job, rep = jobs[0][0], reports[0]
    names = [s.name for s in job.get("states", ())]
    fns = {k: job.get(k) for k in ("encoder", "initial", "update", "score")}
    torch_transducer = TorchCallables(job["kind"], fns, job.get("states", ()), job.get("updater_states") or names,
                                      job.get("scorer_states") or names, job.get("batch", "hyps"),
                                      job.get("scores", "log-probs") == "log-probs", rep.uses_encoder_lengths,
                                      job.get("history", 1), job.get("start_label", 0))
    rasr = [RasrEmulator(job["kind"], values[0])] + [managed_member(v, "lm") for v in values[1:]]
    torch_side = [torch_transducer] + [torch_member(j, r, "lm", None, None) for (j, _), r in zip(jobs[1:], reports[1:])]
    return rasr, torch_side, [float(v["scale"]) for v in values]


def prove(text: str, jobs, reports, beam: int, utterances, seed: int) -> List[dict]:
    """Every search of the transducer's own proof, combined: the graphs and PyTorch decode the same labels,
    costs (the sums of scaled costs) within 1e-3 per symbol."""
    rasr, torch_side, scales = _members(text, jobs, reports)
    job = jobs[0][0]
    blank, kind, max_symbols = job["blank"], job["kind"], job.get("max_symbols", 3)
    graphs, eager = TimeSynchronous(rasr, scales, blank), TimeSynchronous(torch_side, scales, blank)
    lengths = utterances or sorted({d["feature_frames"] for d in reports[0].decodes})
    gen = np.random.default_rng(seed)
    decodes = []
    for n in lengths:
        features = gen.standard_normal((1, n, job["features"].dims[2])).astype(np.float32)
        frames = graphs.encode(features)
        if eager.encode(features) != frames:
            raise DecodeMismatch(f"{n} feature frames: the graphs give {frames} encoder frames, PyTorch another count",
                                 graph="encoder", tensor="outputs", rule="decode as PyTorch")
        for search in searches(kind, beam):
            got, want = (time_sync(s, frames, search["beam"], blank, search["vertical"], max_symbols)
                         for s in (graphs, eager))
            if got.labels != want.labels or abs(got.cost - want.cost) > 1e-3 * (1 + frames + len(want.labels)):
                raise DecodeMismatch(f"combined {search['name']}, {n} feature frames: the graphs decode "
                                     f"{list(got.labels)} (cost {got.cost:.6f}), PyTorch {list(want.labels)} (cost "
                                     f"{want.cost:.6f})", graph="scorer", tensor="scores", rule="decode as PyTorch")
            decodes.append({"feature_frames": n, "encoder_frames": frames, "search": search["name"],
                            "labels": list(got.labels), "cost_onnx": round(got.cost, 6),
                            "cost_pytorch": round(want.cost, 6)})
    return decodes
