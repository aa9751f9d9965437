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
from .folder_report import FolderReport


@dataclass
class FunAsrReport(FolderReport):
    """What was written (``parts``: the ``PartsReport``), the metadata, the language decoded with, the consumers'
    runs, notes (FunASR settings sherpa-onnx does not follow, such as ``dither``)."""

    contract: str
    parts: object
    metadata: Dict[str, str]
    language: Optional[str] = None
    consumer_checks: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"contract": self.contract, "metadata": self.metadata, "language": self.language,
                "files": self.files, "consumer_checks": self.consumer_checks, "notes": self.notes,
                "parts": self.parts.to_dict()}



def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class SenseVoiceGraph(torch.nn.Module):
    """The graph sherpa-onnx loads: ``(x, x_length, language, text_norm) -> logits``, FunASR's ``export_forward``
    (``sense_voice/export_meta.py``) from the model's parts -- ``embed`` (the four prefix queries: language,
    event 1, emotion 2, text norm), ``encoder``, ``ctc.ctc_lo`` -- so FunASR's own ``SenseVoiceSmall``, whose
    ``forward`` is its training step, exports as well; without the lengths output, which sherpa-onnx does not
    read."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, x_length, language, text_norm):
        m = self.model
        queries = [m.embed(language.long()).unsqueeze(1),
                   m.embed(torch.tensor([[1, 2]], device=x.device)).repeat(x.size(0), 1, 1),
                   m.embed(text_norm.long()).unsqueeze(1)]
        encoded = _first(m.encoder(torch.cat([*queries, x], dim=1), x_length + 4))
        return m.ctc.ctc_lo(encoded)


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


SENSE_VOICE_PARTS = ("embed", "encoder", "ctc.ctc_lo", "lid_dict", "textnorm_dict", "blank_id")
PARAFORMER_PARTS = ("encoder.embed", "encoder.encoders0", "encoder.encoders", "encoder.after_norm",
                    "predictor.pad", "predictor.cif_conv1d", "predictor.cif_output", "predictor.tail_threshold",
                    "decoder.decoders", "decoder.decoders3", "decoder.after_norm", "decoder.output_layer", "eos")


def _check_parts(contract: str, model, names: Sequence[str]) -> None:
    """The FunASR attributes the graph is built from, all present (else one refusal naming the missing ones)."""
    def has(path: str) -> bool:
        obj = model
        for name in path.split("."):
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    missing = [n for n in names if not has(n)]
    if missing:
        raise ContractError(contract, [Finding("model", f"FunASR's parts {list(names)}", f"{type(model).__name__} "
                                               f"without {missing}")])


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
    _check_parts(sv.NAME, model, SENSE_VOICE_PARTS)
    language = sv.choose_language(model.lid_dict, language)
    classes = model.ctc.ctc_lo.out_features
    _check_vocabulary(sv.NAME, tokens, classes)
    front = sf.front_end(sv.NAME, frontend_conf, cmvn, model.embed.embedding_dim)
    meta = sv.metadata(front, model.lid_dict, model.textnorm_dict, classes, model.blank_id, metadata)
    queries = model.embed.num_embeddings
    sv.check_metadata(meta, front, queries, classes)
    ints = [TensorSpec(name, [Dim("batch")], torch.int32, values=(0, queries)) for name in ("language", "text_norm")]
    part = _graph_part("model", SenseVoiceGraph(model), front.width, classes, ints, meta)
    lang_id = int(meta[f"lang_{language}"])
    norm_id = int(meta["with_itn" if use_itn else "without_itn"])
    from ..contracts.sherpa_funasr_consumers import FunAsrRun, sense_voice_ids
    checks: List[dict] = []

    def judge(protos) -> None:
        sv.check(protos["model"], meta, front, queries)
        decode = sense_voice_ids(SenseVoiceGraph(model), lang_id, norm_id, int(meta["blank_id"]))
        run = FunAsrRun("sense-voice", decode,
                        sf.FrontEnd(front.n_mels, front.lfr_m, front.lfr_n, meta["neg_mean"], meta["inv_stddev"],
                                    meta["normalize_samples"] == "0"), list(tokens), language, use_itn)
        _prove(protos, tokens, run, verify, checks)

    report = export_parts([part], os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": sf.tokens_text(tokens)})
    return FunAsrReport(sv.NAME, report, meta, language, checks, _dither_note(front))


def cif_weights(alphas: torch.Tensor, token_num: torch.Tensor) -> torch.Tensor:
    """``[B, T, T]``: how much of frame ``t`` goes into token ``j`` -- the overlap of the frame's stretch of the
    running alpha sum, ``[c_{t-1}, c_t]``, with ``[j, j + 1]`` -- zero for ``j >= token_num``. FunASR's
    integrate-and-fire (threshold 1) in closed form, with one row per frame instead of a data-dependent count, so
    both exporters take it (FunASR's ``cif_v1_export`` indexes with a boolean mask)."""
    total = torch.cumsum(alphas, dim=1, dtype=torch.float64).to(torch.float32)
    before = torch.cat([torch.zeros_like(total[:, :1]), total[:, :-1]], 1)
    j = torch.arange(alphas.size(1), device=alphas.device, dtype=torch.float32)[None, :, None]
    overlap = torch.minimum(total[:, None, :], j + 1) - torch.maximum(before[:, None, :], j)
    fired = j < token_num.to(torch.float32)[:, None, None]
    return overlap.clamp(min=0) * fired.to(torch.float32)


def _mask(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    return (torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]).to(torch.float32)


def cif_alphas(predictor: torch.nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T + 1]``: FunASR's ``CifPredictorV2`` weights from its parts (``pad``, ``cif_conv1d``,
    ``cif_output``, ``smooth_factor``, ``noise_threshold``), masked by ``mask`` ``[B, T]``, with its
    ``tail_threshold`` one frame past each item's end (``tail_process_fn``)."""
    p = predictor
    out = torch.relu(p.cif_conv1d(p.pad(hidden.transpose(1, 2)))).transpose(1, 2)
    alphas = torch.relu(torch.sigmoid(p.cif_output(out)) * p.smooth_factor - p.noise_threshold).squeeze(-1) * mask
    zeros = torch.zeros_like(mask[:, :1])
    tail = (torch.cat([zeros + 1, mask], 1) - torch.cat([mask, zeros], 1)) * p.tail_threshold
    return torch.cat([alphas, zeros], 1) + tail


def paraformer_forward(model: torch.nn.Module, speech: torch.Tensor, speech_lengths: torch.Tensor):
    """FunASR's ``export_forward`` (``paraformer/export_meta.py``) from the model's parts, with its own predictor
    (FunASR's CIF, a data-dependent token count): ``(log-probs [N, U, V], token_num int32)``. PyTorch's side of
    the proof; FunASR's ``Paraformer.forward`` is its training step."""
    enc, enc_len = model.encoder(speech, speech_lengths)[:2]
    embeds, token_num = model.predictor(enc, mask=_mask(enc_len, enc.size(1))[:, None, :])[:2]
    token_num = token_num.floor().to(torch.int32)
    return torch.log_softmax(_first(model.decoder(enc, enc_len, embeds, token_num)), dim=-1), token_num


def encoder_output(encoder: torch.nn.Module, speech: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """FunASR's ``SANMEncoder.forward`` (``input_layer: pe``) from its layers, masked over the input's own length
    (FunASR's masks ``max(lengths)`` frames, so it refuses a batch padded past its longest item: sherpa-onnx never
    feeds one, the export's verification does)."""
    mask = _mask(lengths, speech.size(1))[:, None, :]
    x = encoder.embed(speech * encoder.output_size() ** 0.5)
    for layer in list(encoder.encoders0) + list(encoder.encoders):
        x = _first(layer(x, mask))
    return encoder.after_norm(x)


def decoder_logits(decoder: torch.nn.Module, enc, enc_len, embeds, token_num) -> torch.Tensor:
    """FunASR's ``ParaformerSANMDecoder.forward`` from its layers, over ``embeds``' own length: FunASR's masks the
    targets to ``max(token_num)`` positions, which is data-dependent; here the masks come from the lengths over
    the given axes (the layers mask their inputs, so each item's first ``token_num`` positions do not change)."""
    tgt_mask = _mask(token_num, embeds.size(1))[:, :, None]
    memory_mask = _mask(enc_len, enc.size(1))[:, None, :]
    x = embeds
    for layers in (decoder.decoders, getattr(decoder, "decoders2", None), decoder.decoders3):
        for layer in layers or ():
            x = _first(layer(x, tgt_mask, enc, memory_mask))
    return decoder.output_layer(decoder.after_norm(x))


class ParaformerGraph(torch.nn.Module):
    """The graph sherpa-onnx loads: ``(speech, speech_lengths) -> (logits, token_num)``, FunASR's
    ``export_forward`` with three changes that keep each utterance's decode and make a padded batch decode like
    its utterances alone: the encoder output zeroed on padded frames (FunASR lets them into the predictor's
    convolution and, through the tail threshold put on the first padded frame, into the last token: measured, a
    batch in sherpa-onnx then decodes other tokens than each utterance alone); the CIF in closed form
    (``cif_weights``) over one row per frame; every position at or past an item's ``token_num`` set to ``</s>``
    (log-prob 0 there, -1e4 elsewhere): sherpa-onnx reads all positions of the padded batch up to ``</s>``, FunASR
    each item's ``token_num``, and with this they read the same tokens."""

    def __init__(self, model: torch.nn.Module, eos: int):
        super().__init__()
        self.model, self.eos = model, eos

    def forward(self, speech, speech_lengths):
        m = self.model
        enc, enc_len = encoder_output(m.encoder, speech, speech_lengths), speech_lengths
        mask = _mask(enc_len, enc.size(1))
        enc = enc * mask[:, :, None]  # padded frames as one utterance alone has them: none (zeros)
        alphas = cif_alphas(m.predictor, enc, mask)
        token_num = torch.floor(alphas.sum(-1))
        hidden = torch.cat([enc, torch.zeros_like(enc[:, :1])], 1)
        embeds = torch.matmul(cif_weights(alphas, token_num), hidden)
        logits = torch.log_softmax(decoder_logits(m.decoder, enc, enc_len, embeds, token_num), dim=-1)
        past = torch.arange(logits.size(1), device=logits.device)[None, :] >= token_num[:, None]
        eos_row = torch.full_like(logits[:1, :1], -1e4).index_fill(2, torch.tensor([self.eos]), 0.0)
        return torch.where(past[:, :, None], eos_row, logits), token_num.to(torch.int32)


def export_paraformer(model: torch.nn.Module, out, *, tokens: Sequence[str], frontend_conf: Mapping[str, object],
                      cmvn, exporter: str = "auto", verify: bool = True, metadata: Optional[Mapping[str, str]] = None,
                      atol: float = 1e-4, rtol: float = 1e-3, opset: Optional[int] = None) -> FunAsrReport:
    """Write FunASR's ``Paraformer`` ``model`` into the folder ``out`` as sherpa-onnx's offline Paraformer.

    ``tokens``: FunASR's token list (``tokens.json``) in id order, with ``</s>`` at the model's ``eos``.
    ``frontend_conf`` / ``cmvn`` / ``metadata`` / ``verify``: as ``export_sense_voice``'s. sherpa-onnx feeds
    samples times 32768 to every Paraformer, so a front end with ``upsacle_samples`` off is refused.
    """
    from ..contracts import sherpa_paraformer as sp
    from ..contracts.sherpa_funasr_consumers import FunAsrRun, paraformer_ids
    from .export import export_parts
    _check_parts(sp.NAME, model, PARAFORMER_PARTS)
    classes = model.decoder.output_layer.out_features
    _check_vocabulary(sp.NAME, tokens, classes)
    eos = sp.eos_id(tokens, getattr(model, "eos", None))
    front = sf.front_end(sp.NAME, frontend_conf, cmvn, model.encoder.encoders0[0].in_size)
    if not front.upscale:
        raise ContractError(sp.NAME, [Finding("frontend_conf 'upsacle_samples'", "True (sherpa-onnx feeds every "
                                              "Paraformer samples times 32768)", "False")])
    meta = sp.metadata(front, classes, metadata)
    sp.check_metadata(meta, front, classes)
    part = _graph_part("model", ParaformerGraph(model, eos), front.width, classes, (), meta)
    part.outputs = [*part.outputs, TensorSpec("token_num", [Dim("batch")], torch.int32)]
    checks: List[dict] = []

    def judge(protos) -> None:
        sp.check(protos["model"], meta, front)
        forward = lambda speech, lengths: paraformer_forward(model, speech, lengths)  # noqa: E731
        run = FunAsrRun("paraformer", paraformer_ids(forward, eos), sf.FrontEnd(
            front.n_mels, front.lfr_m, front.lfr_n, meta["neg_mean"], meta["inv_stddev"], True), list(tokens))
        _prove(protos, tokens, run, verify, checks)

    report = export_parts([part], os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": sf.tokens_text(tokens)})
    return FunAsrReport(sp.NAME, report, meta, None, checks, _dither_note(front))
