"""Proof by decoding: the same search over the written graphs (called as RASR does) and over PyTorch.

For each utterance (one of the export example's length, one much longer,
one of a single encoder frame) and each search of the kind (greedy and a
beam; label-synchronous for AED; time-synchronous with blank for the
transducer, with labels on the same frame and labels consuming one), both
decodes must give the same labels and costs within ``atol`` per label.
Inside the RASR emulation, every batched run is also checked row by row
against each context scored alone.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import numpy as np

from .errors import DecodeMismatch, LabelScorerError
from .search import label_sync, time_sync


def searches(kind: str, beam: int) -> List[Dict]:
    out = []
    for width in (1, beam):
        name = "greedy" if width == 1 else f"beam {width}"
        if kind == "stateful":
            out.append({"name": f"{name}, label-synchronous", "beam": width})
        elif kind == "ctc":
            out.append({"name": f"{name}, time-synchronous", "beam": width, "vertical": False})
        else:
            for vertical in (True, False):
                out.append({"name": f"{name}, time-synchronous, labels {'stay on' if vertical else 'consume'} "
                                    "the frame", "beam": width, "vertical": vertical})
    return out


def decode(scorer, kind: str, frames: int, search: Dict, blank, sentence_end, max_symbols: int,
           labels_per_frame: float):
    if kind == "stateful":
        return label_sync(scorer, search["beam"], sentence_end, max(1, math.ceil(labels_per_frame * frames)))
    return time_sync(scorer, frames, search["beam"], blank, search["vertical"], max_symbols)


def reference(kind: str, torch_scorer, utterances: Sequence[np.ndarray], beam: int, blank, sentence_end,
              max_symbols: int = 3, labels_per_frame: float = 2.0) -> Dict:
    """PyTorch's decodes, ``{(utterance index, search name): (encoder frames, Hyp)}``: run before any graph is
    exported (an empty proof is refused then, not after minutes of export), and reused by ``prove``."""
    out = {}
    for k, features in enumerate(utterances):
        frames = torch_scorer.encode(features)
        for search in searches(kind, beam):
            out[k, search["name"]] = (frames, decode(torch_scorer, kind, frames, search, blank, sentence_end,
                                                     max_symbols, labels_per_frame))
    return out


def prove(kind: str, rasr, torch_scorer, utterances: Sequence[np.ndarray], beam: int, blank, sentence_end,
          max_symbols: int = 3, labels_per_frame: float = 2.0, atol: float = 1e-3,
          wanted: Dict = None) -> List[Dict]:
    """One entry per utterance and search; a ``DecodeMismatch`` at the first disagreement. ``wanted``:
    PyTorch's decodes from ``reference`` (else decoded here)."""
    if wanted is None:
        wanted = reference(kind, torch_scorer, utterances, beam, blank, sentence_end, max_symbols, labels_per_frame)
    decodes = []
    for k, features in enumerate(utterances):
        frames = rasr.encode(features)
        if wanted[k, searches(kind, beam)[0]["name"]][0] != frames:
            raise DecodeMismatch(f"the encoder graph gives {frames} frames for {features.shape[1]} feature frames, "
                                 "PyTorch another count", graph="encoder", tensor="outputs", rule="decode as PyTorch")
        for search in searches(kind, beam):
            got = decode(rasr, kind, frames, search, blank, sentence_end, max_symbols, labels_per_frame)
            want = wanted[k, search["name"]][1]
            where = f"{search['name']}, {features.shape[1]} feature frames ({frames} encoder frames)"
            if got.labels != want.labels:
                raise DecodeMismatch(f"{where}: the graphs called as RASR calls them decode {list(got.labels)} "
                                     f"(cost {got.cost:.6f}), PyTorch {list(want.labels)} (cost {want.cost:.6f})",
                                     graph="scorer", tensor="scores", rule="decode as PyTorch")
            if abs(got.cost - want.cost) > atol * (1 + len(want.labels)):
                raise DecodeMismatch(f"{where}: cost {got.cost:.6f} through the graphs, {want.cost:.6f} in PyTorch",
                                     graph="scorer", tensor="scores", rule="decode as PyTorch")
            decodes.append({"feature_frames": int(features.shape[1]), "encoder_frames": int(frames),
                            "search": search["name"], "labels": list(got.labels), "cost_onnx": round(got.cost, 6),
                            "cost_pytorch": round(want.cost, 6)})
    return decodes


def refuse_empty_early(kind: str, torch_scorer, utterances: Sequence[np.ndarray], beam: int, blank, sentence_end,
                       max_symbols: int = 3, labels_per_frame: float = 2.0) -> None:
    """Before any graph is exported: PyTorch's greedy decode of the utterances one by one until one holds a
    label (usually the first, a few steps); only if none does are the other searches run, and an all-empty
    proof refused (``check_decoded``) before minutes of export rather than after."""
    first = searches(kind, beam)[0]
    for features in utterances:
        frames = torch_scorer.encode(features)
        if decode(torch_scorer, kind, frames, first, blank, sentence_end, max_symbols, labels_per_frame).labels:
            return
    wanted = reference(kind, torch_scorer, utterances, beam, blank, sentence_end, max_symbols, labels_per_frame)
    check_decoded([{"labels": list(hyp.labels)} for _, hyp in wanted.values()])


def check_decoded(decodes: Sequence[Dict]) -> List[str]:
    """A proof that decoded nothing proves nothing: every decode empty is refused (the scorer ends at once,
    or blank wins every frame: an untrained model, a wrong ``sentence_end``/``blank`` id). A proof whose
    decodes hold one label at most is kept with a note saying so (returned)."""
    if not any(d["labels"] for d in decodes):
        raise LabelScorerError(f"every one of the {len(decodes)} decodes of the proof is empty (the graphs and "
                               "PyTorch agree on nothing at all): the first label scored best is always the end "
                               "(sentence_end) or blank wins every frame, so no label's cost was compared; check "
                               "the sentence_end/blank id and that the weights are trained, or pass longer "
                               "utterances=", graph="scorer", tensor="scores", rule="proof decodes labels")
    labels = {v for d in decodes for v in d["labels"]}
    if len(labels) < 2:
        return [f"every decode of the proof holds the label {sorted(labels)} at most: the comparison shows little "
                "beyond that label's cost (an untrained model decodes one label repeated)"]
    return []
