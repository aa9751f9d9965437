"""The decode proof of a ``state-managed-onnx`` folder, run on the verified graphs before they are written.

RASR's loader emulated with the config fragment as written (``managers.findings``); then greedy and beam
through the graph as RASR master calls it (``managed_search.ManagedScorer`` over an ONNX Runtime session)
against the same search over the eager wrapper, on each utterance for an AED; then hypotheses of prefix
lengths 0 to 5 in one run, each row against it alone and against PyTorch.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import numpy as np
import onnx
import torch

from . import config, managers
from .errors import DecodeMismatch, LabelScorerError
from .managed_search import Ctx, GraphRun, ManagedScorer, eager_call, session_call
from .proof import check_decoded
from .search import label_sync


def proof(report, text: str, wrapper: torch.nn.Module, input_names, outputs, encoder, feats, vocab,
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
        report.decodes = decodes(rasr, torch_side, runs, encoders, feats, beam, sentence_end, max_labels)
        report.notes += check_decoded(report.decodes)
        report.mixed_batch = mixed_batch(rasr, torch_side, vocab)
        report.row_max_abs_err, report.rows_checked = rasr.row_error, rasr.rows_checked

    return rasr_loads_and_decodes


def encode(encoders, features: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    session, io_map, encoder = encoders
    feeds = {io_map["features"]: features}
    if "features-size" in io_map:
        feeds[io_map["features-size"]] = np.array([features.shape[1]], np.int32)
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    with torch.no_grad():
        mine, _ = encoder(torch.from_numpy(features), torch.tensor([features.shape[1]], dtype=torch.int32))
    return out[io_map["outputs"]], mine.numpy()


def decodes(rasr, torch_side, runs, encoders, feats, beam, sentence_end, max_labels) -> List[dict]:
    """Greedy and beam through the graphs as RASR calls them and through the eager wrapper: same labels, costs
    within 1e-3 per label. An AED decodes each utterance up to two labels per encoder frame."""
    decodes = []
    for features in (feats if feats is not None else [None]):
        limit, frames = max_labels, None
        if features is not None:
            runs[0].enc, runs[1].enc = encode(encoders, features)
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
