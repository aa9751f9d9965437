"""``export_vits`` / ``export_matcha``: a TTS voice written as sherpa-onnx's offline TTS model, proven by synthesis.

One call each. Before any export: the variant, the sample rate, the tokens (the symbols the variant's front ends
look up, one character each, ids inside the model's embedding), the lexicon (its symbols in tokens.txt), the
speakers (``n_speakers`` as the model has them, the proof's speaker inside them) and -- Matcha -- the vocoder's mel
bins against the acoustic model's. Then the graphs are exported and verified at new shapes by ``export_parts``
(random draws fed eager's own), checked by position and by sherpa-onnx's name checks, and the texts are
synthesized in sherpa-onnx (Python binding, native binary) from a folder holding the files as they will be
written, against PyTorch's synthesis of the same token ids (noise scales 0). Only then is anything written.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
import torch

from ..contracts import sherpa_tts as st
from ..contracts.base import ContractError, Finding
from ..pipeline.steps import Step
from ..spec import Dim, TensorSpec
from .folder_report import FolderReport

PROOF_TEXTS = 3
CONSUMER_ATOL = 1e-4  # float32 audio in [-1, 1]: the graph's rounding, not a tolerance for a wrong duration


@dataclass
class TtsReport(FolderReport):
    """What was written (``parts``: the ``PartsReport``), the metadata of each graph, the proof's texts and ids,
    the consumers' runs (per text: samples, max_abs_err, worst sample)."""

    contract: str
    parts: object
    metadata: Dict[str, Dict[str, str]]
    texts: List[str] = field(default_factory=list)
    ids: List[List[List[int]]] = field(default_factory=list)
    consumer_checks: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"contract": self.contract, "metadata": self.metadata, "files": self.files, "texts": self.texts,
                "ids": self.ids, "consumer_checks": self.consumer_checks, "notes": self.notes,
                "parts": self.parts.to_dict()}



class PiperGraph(torch.nn.Module):
    """piper's ``export_onnx.py`` forward over a VITS ``SynthesizerTrn``: ``scales`` = (noise, length, noise_w),
    ``sid`` only multi-speaker; returns ``infer``'s audio ``[1, 1, samples]``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, x_length, scales, sid: Optional[torch.Tensor] = None):
        return self.model.infer(x, x_length, sid=sid, noise_scale=scales[0], length_scale=scales[1],
                                noise_scale_w=scales[2])[0]


def synthesize(model: torch.nn.Module, ids: Sequence[int], sid: int = 0) -> torch.Tensor:
    """PyTorch's waveform of one sentence's ids as sherpa-onnx feeds them: batch 1, ``x_length`` = the length,
    noise scales 0, length scale 1."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    sid_t = torch.tensor([sid], dtype=torch.long) if getattr(model, "n_speakers", 1) > 1 else None
    with torch.no_grad():
        return PiperGraph(model).eval()(x, torch.tensor([x.shape[1]]), torch.tensor([0.0, 1.0, 0.0]), sid_t).flatten()


def proof_texts(voice: st.Voice, texts: Optional[Sequence[str]]) -> List[str]:
    """The texts the proof synthesizes: the caller's, else three made of the lexicon's words (the last of two
    sentences, so sherpa-onnx's sentence split and concatenation are in the proof)."""
    if texts is None:
        vocab = list(voice.lexicon)
        pick = lambda k, n: " ".join(vocab[(k * 3 + i) % len(vocab)] for i in range(n))  # noqa: E731
        texts = [f"{pick(0, 3)}.", f"{pick(1, 5)}, {pick(2, 2)}!", f"{pick(3, 2)}. {pick(4, 4)}?"]
    return list(texts)


def _ids_findings(name: str, voice: st.Voice, texts: Sequence[str]) -> List[Finding]:
    found = [] if texts else [Finding("proof texts", "at least one text to synthesize", "none")]
    for k, text in enumerate(texts):
        if not text.isascii():
            found.append(Finding(f"proof text {k}", "ASCII (the reference front end splits ASCII text as "
                                 "sherpa-onnx does)", repr(text)))
        elif not st.text_to_ids(text, voice):
            found.append(Finding(f"proof text {k}", "a word of the lexicon", repr(text)))
    return found


def _write_front_end(folder: str, voice: st.Voice) -> Dict[str, str]:
    files = {"tokens.txt": st.tokens_text(voice.tokens), "lexicon.txt": st.lexicon_text(voice.lexicon)}
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return files


def _prove(protos: Mapping[str, onnx.ModelProto], voice: st.Voice, run, atol: float, checks: List[dict]) -> None:
    """The graphs, tokens.txt and lexicon.txt as they will be written, in a temporary folder, synthesized by each
    installed consumer (a difference raises ``ConsumerMismatch``)."""
    from ..contracts.sherpa_tts_consumers import in_consumers
    with tempfile.TemporaryDirectory(prefix="onnx_compat_tts_") as tmp:
        for name, proto in protos.items():
            onnx.save(proto, os.path.join(tmp, f"{name}.onnx"))
        _write_front_end(tmp, voice)
        checks.extend(in_consumers(tmp, run, atol))


def _vits_specs(n_vocab: int, speakers: int):
    x = TensorSpec("x", [1, Dim("L", min=8, max=80, example=12)], torch.int64, values=(0, n_vocab))
    inputs = [x, TensorSpec("x_length", [1], torch.int64, values=(1, 8)),
              TensorSpec("scales", [3], torch.float32, values=(0.5, 1.2))]
    if speakers > 1:
        inputs.append(TensorSpec("sid", [1], torch.int64, values=(0, speakers)))
    return inputs, [TensorSpec("audio", [1, 1, Dim("samples")])]


def _vits_checks(model, voice: st.Voice, variant: str, meta: Mapping[str, str], sid: int,
                 texts: Sequence[str]) -> List[Finding]:
    n_vocab, speakers = model.enc_p.emb.num_embeddings, max(int(getattr(model, "n_speakers", 1)), 1)
    found = [] if variant in st.VARIANTS else [Finding("variant", f"one of {list(st.VARIANTS)}", repr(variant))]
    found += st.metadata_findings(st.VITS_KEYS, meta)
    if not found:
        found += st.token_findings(variant, voice.tokens, n_vocab) + st.lexicon_findings(voice)
    found += st.speaker_findings(meta, speakers, [sid])
    return found + ([] if found else _ids_findings(st.VITS, voice, texts))


def export_vits(model: torch.nn.Module, out, *, tokens: Mapping[str, int], lexicon: Mapping[str, Sequence[str]],
                sample_rate: Optional[int], language: str = "English", variant: str = "piper",
                punctuation: str = "", add_blank: bool = False, texts: Optional[Sequence[str]] = None, sid: int = 0,
                exporter: str = "auto", verify: bool = True, metadata: Optional[Mapping[str, str]] = None,
                atol: float = 1e-4, rtol: float = 1e-3, consumer_atol: float = CONSUMER_ATOL,
                opset: Optional[int] = None) -> TtsReport:
    """Write a VITS voice (piper's / coqui's ``SynthesizerTrn``: ``infer``, ``enc_p.emb``, ``n_speakers``) into the
    folder ``out`` as sherpa-onnx's VITS model: ``model.onnx`` (piper's input layout), ``tokens.txt``,
    ``lexicon.txt``.

    ``tokens``: ``{symbol: id}`` (the voice's ``phoneme_id_map``; ``" "`` is the word separator the lexicon front
    end puts between words); ``lexicon``: ``{word: [symbol, ...]}``, so sherpa-onnx needs no espeak-ng data.
    ``variant``: "piper" or "coqui" (the ``comment``). ``metadata``: values over the derived keys (checked like
    them). ``texts``: the proof's texts (default three made of lexicon words), synthesized with speaker ``sid``.
    """
    from . import Part
    from .export import export_parts
    voice = st.Voice(dict(tokens), {w: list(s) for w, s in lexicon.items()}, language, punctuation, add_blank)
    speakers = max(int(getattr(model, "n_speakers", 1)), 1)
    meta = st.vits_metadata(voice, variant, sample_rate, speakers, metadata)
    texts = proof_texts(voice, texts) if voice.lexicon else []
    st.refuse(st.VITS, _vits_checks(model, voice, variant, meta, sid, texts))
    ids = [st.text_to_ids(text, voice) for text in texts]
    from ..contracts.sherpa_tts_consumers import TtsRun
    expected = [np.concatenate([synthesize(model, s, sid).double().numpy() for s in sentences]) for sentences in ids]
    run = TtsRun("vits", texts, sid, expected, int(meta["sample_rate"]))
    inputs, outputs = _vits_specs(model.enc_p.emb.num_embeddings, speakers)
    checks: List[dict] = []

    def judge(protos) -> None:
        contract = st.vits_contract(speakers > 1)
        try:
            contract.check(protos["model"], None, meta)
        except ContractError as exc:
            raise ContractError(st.VITS, exc.findings) from None
        st.refuse(st.VITS, st.name_findings(protos["model"], {3: "sid"} if speakers > 1 else {}, "model"))
        if verify:
            _prove(protos, voice, run, consumer_atol, checks)

    part = Part("model", PiperGraph(model), inputs, outputs, metadata=meta)
    report = export_parts([part], os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": st.tokens_text(voice.tokens),
                                                       "lexicon.txt": st.lexicon_text(voice.lexicon)})
    return TtsReport(st.VITS, report, {"model": meta}, texts, ids, checks,
                     ["noise scales 0 in the proof: the graph's randn_like draws are multiplied by 0 on both sides"])


class DeclaredStaticDims(Step):
    """A declared static output dim the exporter left symbolic (TorchScript names Vocos's ``n_fft/2+1`` bins
    ``Clipmag_dim_1``) is written into the graph's output shape: verification ran the graph and compared that
    size with eager's. The contract's static-axis checks then read what the consumer gets."""

    name = "tts-static-dims"

    def __init__(self, outputs: Sequence[TensorSpec]) -> None:
        self.declared, self.changed = {s.name: s.dims for s in outputs}, []

    def before_write(self, request, report, proto) -> None:
        for value in proto.graph.output:
            for axis, (dim, want) in enumerate(zip(value.type.tensor_type.shape.dim, self.declared.get(value.name, ()))):
                if isinstance(want, int) and not dim.HasField("dim_value"):
                    self.changed.append(f"{value.name} dim {axis}: {dim.dim_param or '?'} -> {want}")
                    dim.Clear()
                    dim.dim_value = want

    def describe(self) -> dict:
        return {"stamped": list(self.changed)}


class MatchaGraph(torch.nn.Module):
    """The acoustic graph sherpa-onnx loads: ``(x, x_length, scales[2]) -> mel`` over a Matcha model's
    ``synthesise``, the ODE steps fixed at construction (sherpa-onnx feeds no step count)."""

    def __init__(self, model: torch.nn.Module, n_timesteps: int):
        super().__init__()
        self.model, self.n_timesteps = model, n_timesteps

    def forward(self, x, x_length, scales):
        return self.model.synthesise(x, x_length, self.n_timesteps, temperature=scales[0], length_scale=scales[1])


class MatchaSpeakersGraph(MatchaGraph):
    """A multi-speaker Matcha as sherpa-onnx feeds it (icefall's layout, the only one it gives a speaker to):
    ``(x, x_length, noise_scale[1], length_scale[1], sid[1]) -> mel``."""

    def forward(self, x, x_length, noise_scale, length_scale, sid):
        return self.model.synthesise(x, x_length, self.n_timesteps, temperature=noise_scale, spks=sid,
                                     length_scale=length_scale)


def matcha_waveform(acoustic, vocoder, kind: str, steps: int, ids: Sequence[int], sid: int = 0) -> np.ndarray:
    """PyTorch's waveform of one sentence's ids: the acoustic model with ``steps`` Euler steps, noise 0, length 1,
    then the vocoder (Vocos: its magnitude and phase through ``torch.istft``, a Hann window, center=True)."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        if getattr(acoustic, "n_speakers", 1) > 1:
            mel = MatchaSpeakersGraph(acoustic, steps).eval()(x, torch.tensor([x.shape[1]]), torch.tensor([0.0]),
                                                              torch.tensor([1.0]), torch.tensor([sid]))
        else:
            mel = MatchaGraph(acoustic, steps).eval()(x, torch.tensor([x.shape[1]]), torch.tensor([0.0, 1.0]))
        audio = vocoder.waveform(mel) if kind == "vocos" else vocoder(mel)
    return audio.double().numpy().ravel()


def _matcha_parts(acoustic, vocoder, kind: str, steps: int, meta, vocoder_meta):
    from . import Part
    n_vocab, bins = acoustic.encoder.emb.num_embeddings, st.mel_bins(acoustic)
    speakers = getattr(acoustic, "n_speakers", 1)
    inputs = [TensorSpec("x", [1, Dim("L", min=4, max=80, example=12)], torch.int64, values=(0, n_vocab)),
              TensorSpec("x_length", [1], torch.int64, values=(1, 4))]
    if speakers > 1:
        inputs += [TensorSpec(n, [1], torch.float32, values=(0.5, 1.2)) for n in ("noise_scale", "length_scale")]
        inputs.append(TensorSpec("sid", [1], torch.int64, values=(0, speakers)))
        graph = MatchaSpeakersGraph(acoustic, steps)
    else:
        inputs.append(TensorSpec("scales", [2], torch.float32, values=(0.5, 1.2)))
        graph = MatchaGraph(acoustic, steps)
    mel_out = [TensorSpec("mel", [1, bins, Dim("frames")])]
    acoustic_part = Part("acoustic_model", graph, inputs, mel_out, metadata=meta, steps=[DeclaredStaticDims(mel_out)])
    mel = [TensorSpec("mel", [1, bins, Dim("frames", min=4, max=200, example=20)])]
    outs = [TensorSpec("audio", [1, Dim("samples")])] if kind == "hifigan" else \
        [TensorSpec(n, [1, vocoder.n_fft // 2 + 1, Dim("frames_out")]) for n in ("mag", "x", "y")]
    return [acoustic_part, Part("vocoder", vocoder, mel, outs, metadata=vocoder_meta,
                                steps=[DeclaredStaticDims(outs)])]


def export_matcha(acoustic: torch.nn.Module, vocoder: torch.nn.Module, out, *, vocoder_type: str,
                  tokens: Mapping[str, int], lexicon: Mapping[str, Sequence[str]], sample_rate: Optional[int],
                  ode_steps: int = 3, language: str = "English", pad_id: int = 0,
                  texts: Optional[Sequence[str]] = None, sid: int = 0, exporter: str = "auto", verify: bool = True,
                  metadata: Optional[Mapping[str, str]] = None, atol: float = 1e-4, rtol: float = 1e-3,
                  consumer_atol: float = CONSUMER_ATOL, opset: Optional[int] = None) -> TtsReport:
    """Write a Matcha acoustic model (``synthesise(x, x_lengths, n_timesteps, temperature, length_scale)``) and its
    vocoder into the folder ``out`` as sherpa-onnx's Matcha model: ``acoustic_model.onnx`` (``x``, ``x_length``,
    ``scales`` = (noise, length) -> ``mel``; ``ode_steps`` Euler steps baked in and written as ``num_ode_steps``),
    ``vocoder.onnx`` (``vocoder_type`` "hifigan": mel -> audio; "vocos": mel -> magnitude, cos, sin, with the
    inverse STFT's settings in its metadata), ``tokens.txt`` and ``lexicon.txt`` (the metadata's ``jieba`` 1 picks
    sherpa-onnx's lexicon front end, so no espeak-ng data is needed; the text is matched as written: lower-case
    words). ``texts``: the proof's texts (default three of lexicon words), synthesized with speaker ``sid``. A
    multi-speaker model (``n_speakers > 1``, ``synthesise(..., spks=ids)``) gets icefall's layout, the only one
    sherpa-onnx feeds a speaker to: ``x``, ``x_length``, ``noise_scale`` ``[1]``, ``length_scale`` ``[1]``,
    ``sid`` ``[1]``.
    """
    from .export import export_parts
    voice = st.Voice(dict(tokens), {w: list(s) for w, s in lexicon.items()}, language)
    speakers = max(int(getattr(acoustic, "n_speakers", 1)), 1)
    meta = st.matcha_metadata(voice, sample_rate, ode_steps, pad_id, {"n_speakers": str(speakers), **(metadata or {})})
    vocoder_meta = st.vocoder_metadata(vocoder_type, vocoder, sample_rate) if vocoder_type in st.VOCODER_KEYS else {}
    texts = list(texts) if texts is not None else [] if not voice.lexicon else [
        t.replace(",", "").split(".")[0] + "." if "." in t else t.replace(",", "") for t in proof_texts(voice, None)]
    found = st.matcha_findings(acoustic, vocoder, vocoder_type, voice, meta, vocoder_meta) + \
        st.speaker_findings(meta, speakers, [sid])
    if not found and meta.get("sample_rate") != vocoder_meta.get("sample_rate", meta.get("sample_rate")):
        found.append(Finding("vocoder metadata 'sample_rate'", meta["sample_rate"], vocoder_meta["sample_rate"]))
    st.refuse(st.MATCHA, found)
    ids = [[st.matcha_text_to_ids(text, voice, pad_id)] for text in texts]
    none = [] if texts else [Finding("proof texts", "at least one text to synthesize", "none")]
    st.refuse(st.MATCHA, none + [Finding(f"proof text {k}", "one sentence of lexicon words (sherpa-onnx merges a "
                                         "text's sentences by its own rule)", repr(t))
                                 for k, (t, i) in enumerate(zip(texts, ids)) if not i[0] or not st.one_sentence(t)])
    from ..contracts.sherpa_tts_consumers import TtsRun
    expected = [np.concatenate([matcha_waveform(acoustic, vocoder, vocoder_type, ode_steps, s, sid)
                                for s in sentences]) for sentences in ids]
    run = TtsRun("matcha", texts, sid, expected, int(meta["sample_rate"]))
    checks: List[dict] = []

    def judge(protos) -> None:
        found = []
        for name, contract, values in (("acoustic_model", st.matcha_contract(speakers > 1), meta),
                                       ("vocoder", st.vocoder_contract(vocoder_type), vocoder_meta)):
            try:
                contract.check(protos[name], None, values)
            except ContractError as exc:
                found += [Finding(f"{name} {f.what}", f.expected, f.got) for f in exc.findings]
        names = {4: "sid"} if speakers > 1 else {2: "scales"}
        st.refuse(st.MATCHA, found + st.name_findings(protos["acoustic_model"], names, "acoustic_model"))
        if verify:
            _prove(protos, voice, run, consumer_atol, checks)

    parts = _matcha_parts(acoustic, vocoder, vocoder_type, ode_steps, meta, vocoder_meta)
    report = export_parts(parts, os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": st.tokens_text(voice.tokens),
                                                       "lexicon.txt": st.lexicon_text(voice.lexicon)})
    return TtsReport(st.MATCHA, report, {"acoustic_model": meta, "vocoder": vocoder_meta}, texts, ids, checks,
                     [f"{ode_steps} Euler steps baked into acoustic_model.onnx (metadata num_ode_steps)",
                      "noise scale 0 in the proof: the decoder's randn_like draw is multiplied by 0 on both sides"])
