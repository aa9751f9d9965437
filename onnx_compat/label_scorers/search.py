"""The two searches RASR runs over label scorers, written once over any ``Scorer``.

``label_sync``: RASR's ``lexiconfree-labelsync-beam-search`` (the AED path):
every active hypothesis scored in one batch per step, the best ``beam``
extensions kept, a hypothesis ends at the sentence end; the search stops
when an ended hypothesis is at least as good as every active one, or after
``max_labels``. ``time_sync``: ``lexiconfree-timesync-beam-search`` (the
transducer and CTC path): one symbol per hypothesis per step, blank
advances the frame; a label advances it too unless ``vertical`` (standard
RNN-T: labels stay on the frame, at most ``max_symbols`` per frame).
``beam=1`` is the greedy search. The same function runs over the ONNX graphs
(``backends.RasrEmulator``) and over the PyTorch callables
(``backends.TorchCallables``), so the decodes differ only if the graphs do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np


@dataclass
class Hyp:
    cost: float
    labels: Tuple[int, ...]
    ctx: Any
    t: int = 0
    emitted: int = 0


def _best(row: np.ndarray, count: int) -> np.ndarray:
    return np.argsort(row, kind="stable")[:count]


def label_sync(scorer, beam: int, sentence_end: int, max_labels: int) -> Hyp:
    hyps, ended = [Hyp(0.0, (), scorer.root())], []
    for _ in range(max_labels):
        costs = scorer.score([h.ctx for h in hyps], 0)
        candidates = sorted(((h.cost + float(row[v]), k, int(v)) for k, (h, row) in enumerate(zip(hyps, costs))
                             for v in _best(row, beam)), key=lambda c: (c[0], c[1], c[2]))[:beam]
        active = []
        for cost, k, v in candidates:
            if v == sentence_end:
                ended.append(Hyp(cost, hyps[k].labels, None))
            else:
                active.append(Hyp(cost, hyps[k].labels + (v,), scorer.extend(hyps[k].ctx, v)))
        hyps = active
        if not hyps or (ended and min(e.cost for e in ended) <= min(h.cost for h in hyps)):
            break
    return min(ended or hyps, key=lambda h: h.cost)


def time_sync(scorer, frames: int, beam: int, blank: int, vertical: bool, max_symbols: int) -> Hyp:
    hyps = [Hyp(0.0, (), scorer.root())]
    while any(h.t < frames for h in hyps):
        new = [h for h in hyps if h.t >= frames]
        groups: Dict[int, List[Hyp]] = {}
        for h in hyps:
            if h.t < frames:
                groups.setdefault(h.t, []).append(h)
        for t, group in sorted(groups.items()):  # RASR batches the contexts of one time step
            for h, row in zip(group, scorer.score([h.ctx for h in group], t)):
                new.append(Hyp(h.cost + float(row[blank]), h.labels, h.ctx, t + 1, 0))
                if vertical and h.emitted >= max_symbols:
                    continue
                for v in (int(v) for v in _best(row, beam + 1) if v != blank):
                    new.append(Hyp(h.cost + float(row[v]), h.labels + (v,), scorer.extend(h.ctx, v),
                                   t if vertical else t + 1, h.emitted + 1 if vertical else 0))
        hyps = sorted(new, key=lambda h: h.cost)[:beam]
    return min(hyps, key=lambda h: h.cost)
