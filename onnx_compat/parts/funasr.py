"""``export_sense_voice`` / ``export_paraformer``: a FunASR model written as sherpa-onnx's offline model, proven.

One call each: the model (FunASR's ``SenseVoiceSmall`` or ``Paraformer``, or one of the same structure), its
``frontend_conf`` (``config.yaml``), its CMVN (``am.mvn``) and its tokens go in; the front end is checked against
the fbank sherpa-onnx computes, the CMVN's size against ``n_mels * lfr_m``, the tokens against the logits, the
language (SenseVoice) against the model's, the ``</s>`` (Paraformer) against the tokens; the single graph is
exported and verified at new shapes by ``export_parts`` (ports in sherpa-onnx's order); the graph and every
metadata key are checked against the contract by position; WAV files are decoded in sherpa-onnx (Python binding,
native binary) against PyTorch's decode on sherpa-onnx's own features; only then are ``model.onnx`` and
``tokens.txt`` written. Every refusal comes before anything is written.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import onnx
import torch

from ..contracts import sherpa_funasr as sf
from ..contracts import sherpa_sense_voice as sv
from ..contracts.base import ContractError, Finding
from ..spec import Dim, TensorSpec


@dataclass
class FunAsrReport:
    """What was written (``parts``: the ``PartsReport``), the metadata, the language decoded with, the consumers'
    runs, notes (FunASR settings sherpa-onnx does not follow, such as ``dither``)."""

    contract: str
    parts: object
    metadata: Dict[str, str]
    language: Optional[str] = None
    consumer_checks: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def files(self) -> List[str]:
        return sorted(self.parts.files.values())

    def to_dict(self) -> dict:
        return {"contract": self.contract, "metadata": self.metadata, "language": self.language,
                "files": self.files, "consumer_checks": self.consumer_checks, "notes": self.notes,
                "parts": self.parts.to_dict()}

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=2)


class SenseVoiceGraph(torch.nn.Module):
    """The graph sherpa-onnx loads: ``(x, x_length, language, text_norm) -> logits`` (FunASR's ``export_forward``
    without the lengths output, which sherpa-onnx does not read)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, x_length, language, text_norm):
        out = self.model(x, x_length, language, text_norm)
        return out[0] if isinstance(out, (tuple, list)) else out


def _graph_part(name: str, module: torch.nn.Module, width: int, classes: int, extra: Sequence[TensorSpec], meta):
    from . import Part
    n = Dim("batch")
    x = TensorSpec("x" if extra else "speech", [n, Dim("T", min=2, max=400, example=23), width], lengths=[1])
    return Part(name, module, [x, *extra], [TensorSpec("logits", [n, Dim("frames"), classes])], metadata=dict(meta))


def _dither_note(front: sf.FrontEnd) -> List[str]:
    if front.dither == 0:
        return []
    return [f"frontend_conf dither {front.dither}: FunASR dithers its fbank, sherpa-onnx does not (dither 0); "
            "the proof decodes without dither, as sherpa-onnx computes"]


def _check_vocabulary(contract: str, vocabulary: Sequence[str], classes: int) -> None:
    found = sf.vocabulary_findings(vocabulary, classes)
    if found:
        raise ContractError(contract, found)


def _prove(protos, vocabulary, run, verify: bool, checks: List[dict]) -> None:
    """The graph and tokens.txt as they will be written, in a temporary folder, decoded by each consumer."""
    if not verify:
        return
    from ..contracts.sherpa_funasr_consumers import in_consumers
    with tempfile.TemporaryDirectory(prefix="onnx_compat_funasr_") as tmp:
        onnx.save(protos["model"], os.path.join(tmp, "model.onnx"))
        with open(os.path.join(tmp, "tokens.txt"), "w", encoding="utf-8") as fh:
            fh.write(sf.tokens_text(vocabulary))
        checks.extend(in_consumers(tmp, run))


def export_sense_voice(model: torch.nn.Module, out, *, tokens: Sequence[str], frontend_conf: Mapping[str, object],
                       cmvn, language: Optional[str] = None, use_itn: bool = False, exporter: str = "auto",
                       verify: bool = True, metadata: Optional[Mapping[str, str]] = None, atol: float = 1e-4,
                       rtol: float = 1e-3, opset: Optional[int] = None) -> FunAsrReport:
    """Write FunASR's ``SenseVoiceSmall`` ``model`` into the folder ``out`` as sherpa-onnx's SenseVoice model.

    ``tokens``: the tokenizer's pieces in id order (one per class of the CTC head). ``frontend_conf``: config.yaml's
    (``n_mels``, ``lfr_m``, ``lfr_n``, ...). ``cmvn``: the ``am.mvn`` path, or ``(neg_mean, inv_stddev)``.
    ``language``: the ``--sense-voice-language`` the proof decodes with (default ``auto``), one of the model's
    ``lid_dict`` that sherpa-onnx reads; ``use_itn``: its text-norm query. ``metadata``: values over the derived
    keys (checked like them). ``verify``: decode WAV files in each installed sherpa-onnx consumer first.
    """
    from .export import export_parts
    language = sv.choose_language(model.lid_dict, language)
    classes = model.ctc.ctc_lo.out_features
    _check_vocabulary(sv.NAME, tokens, classes)
    front = sf.front_end(sv.NAME, frontend_conf, cmvn, model.embed.embedding_dim)
    meta = sv.metadata(front, model.lid_dict, model.textnorm_dict, classes, model.blank_id, metadata)
    queries = model.embed.num_embeddings
    ints = [TensorSpec(name, [Dim("batch")], torch.int32, values=(0, queries)) for name in ("language", "text_norm")]
    part = _graph_part("model", SenseVoiceGraph(model), front.width, classes, ints, meta)
    lang_id = int(meta[f"lang_{language}"])
    norm_id = int(meta["with_itn" if use_itn else "without_itn"])
    from ..contracts.sherpa_funasr_consumers import FunAsrRun, sense_voice_ids
    checks: List[dict] = []

    def judge(protos) -> None:
        sv.check(protos["model"], meta, front, queries)
        run = FunAsrRun("sense-voice", sense_voice_ids(model, lang_id, norm_id, int(meta["blank_id"])),
                        sf.FrontEnd(front.n_mels, front.lfr_m, front.lfr_n, meta["neg_mean"], meta["inv_stddev"],
                                    meta["normalize_samples"] == "0"), list(tokens), language, use_itn)
        _prove(protos, tokens, run, verify, checks)

    report = export_parts([part], os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": sf.tokens_text(tokens)})
    return FunAsrReport(sv.NAME, report, meta, language, checks, _dither_note(front))
