"""sherpa-onnx's offline TTS contracts: VITS (piper / coqui layout) and Matcha with its vocoder (HiFi-GAN, Vocos).

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-tts-vits-model.cc``,
``offline-tts-vits-impl.h``, ``lexicon.cc``, ``piper-phonemize-lexicon.cc``, ``offline-tts-matcha-model.cc``,
``vocoder.cc``, ``vocos-vocoder.cc``, ``offline-tts-impl.cc``), run with the 2.0.1 wheel and its
``sherpa-onnx-offline-tts``. Every graph is bound BY POSITION, with a few name checks.

VITS, piper/coqui variant (chosen by the substring ``piper`` or ``coqui`` of the required metadata ``comment``):
``x`` int64 ``[1, L]``, ``x_length`` int64 ``[1]`` (= L), ``scales`` float ``[3]`` = (noise_scale, length_scale,
noise_scale_w); a 4th input is fed the speaker id only when it is NAMED ``sid`` (any other 4th input is left
unfed and the run fails). Output 0 is the audio; its shape is flattened. Metadata: required ``sample_rate``,
``n_speakers`` (atoi; a speaker id outside ``[0, n_speakers)`` is replaced by 0 with a log line, so a wrong count
plays the wrong voice silently), ``language`` (non-empty), ``comment``; optional ``add_blank`` (blank id 0 between
all ids, lexicon front end only), ``punctuation`` (space-separated marks the lexicon front end keeps as tokens),
``blank_id``/``bos_id``/``eos_id``/``use_eos_bos`` (coqui's espeak front end), ``voice`` (the espeak voice).

Front ends: with ``--vits-data-dir`` (espeak-ng data) piper's ids are ``^``, (phoneme, ``_``)..., ``$`` and
coqui's bos/blank/eos from the metadata with ``,`` looked up; that reader takes one Unicode character per symbol
(``<BLNK>`` skipped) and ends the process on anything else or a duplicate. Without it, ``--vits-lexicon`` is
required: ``word token token ...`` lines, the text lower-cased and split into words and ASCII punctuation, each
word's tokens then the token ``" "`` (a ``tokens.txt`` line holding only an id; looked up with ``at()``: missing
aborts), sentences split at ``. ; ! ? - :`` (each audio synthesized alone, concatenated, with
``max_num_sentences`` 1), the last ``" "`` of the text dropped, unknown words skipped.

Matcha: ``x``, ``x_length``, then ``scales`` float ``[2]`` = (noise, length) when ``input[2]`` is named
``scales``, else ``noise_scale`` and ``length_scale`` float ``[1]``; a 5th input named ``sid`` gets the speaker.
Output 0 is the mel ``[1, n_mels, T]`` for the vocoder (or the audio when named ``audio_output``). Metadata:
required ``sample_rate``, ``n_speakers``, ``use_eos_bos``, ``pad_id``; ``voice``, ``has_espeak``, ``jieba``,
``version``; ``jieba`` 1 with a lexicon and no ``--matcha-data-dir`` is the front end that needs no espeak-ng
data (its ids as the 2.0.1 wheel makes them: ``matcha_text_to_ids``). The vocoder's required ``model_type``: ``hifigan`` (mel -> audio) or ``vocos`` (mel -> magnitude,
cos, sin ``[1, n_fft/2+1, T]``; sherpa-onnx does the inverse STFT itself from ``n_fft``, ``hop_length``,
``win_length``, ``center``, ``normalized``, ``window_type``, ``pad_mode`` in the vocoder's metadata).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from .base import Contract, ContractError, Finding, MetaKey, Port, axes, non_negative_int, positive_int

VITS = "sherpa-onnx/vits"
MATCHA = "sherpa-onnx/matcha"
CONSUMER = "sherpa-onnx offline TTS (OfflineTts, sherpa-onnx-offline-tts)"
VARIANTS = ("piper", "coqui")
SPLITS = ".;!?-:"  # the lexicon front end ends a sentence at these marks (',' only separates)


def _comment(value: str) -> str:
    if not any(v in value for v in VARIANTS):
        raise ValueError(value)
    return value


def _nonempty(value: str) -> str:
    if not value:
        raise ValueError(value)
    return value


_FLAG = ("0", "1")
VITS_KEYS = (
    MetaKey("sample_rate", "the audio's rate", parse=positive_int),
    MetaKey("n_speakers", "speaker ids outside [0, n) become 0", parse=non_negative_int),
    MetaKey("language", "required, non-empty ('Chinese' picks the Chinese lexicon rules)", parse=_nonempty),
    MetaKey("comment", "'piper' or 'coqui' in it picks the input layout", parse=_comment),
    MetaKey("add_blank", "blank 0 between every id (lexicon front end)", allowed=_FLAG, required=False),
    MetaKey("model_type", "informative", allowed=("vits",), required=False),
    MetaKey("blank_id", "coqui's blank", parse=non_negative_int, required=False),
    MetaKey("bos_id", "coqui's bos", parse=non_negative_int, required=False),
    MetaKey("eos_id", "coqui's eos", parse=non_negative_int, required=False),
    MetaKey("use_eos_bos", "coqui's bos/eos on", allowed=_FLAG, required=False),
)
MATCHA_KEYS = (
    MetaKey("sample_rate", "the audio's rate", parse=positive_int),
    MetaKey("n_speakers", "speaker ids outside [0, n) become 0", parse=non_negative_int),
    MetaKey("use_eos_bos", "required by the loader", allowed=_FLAG),
    MetaKey("pad_id", "required by the loader", parse=non_negative_int),
    MetaKey("num_ode_steps", "the ODE steps baked into the graph (informative)", parse=positive_int),
    MetaKey("model_type", "informative", allowed=("matcha-tts",), required=False),
)
VOCODER_KEYS = {
    "hifigan": (MetaKey("model_type", "picks the vocoder", allowed=("hifigan",)),),
    "vocos": (MetaKey("model_type", "picks the vocoder", allowed=("vocos",)),
              MetaKey("n_fft", "iSTFT size", parse=positive_int), MetaKey("hop_length", "iSTFT hop", parse=positive_int),
              MetaKey("win_length", "iSTFT window", parse=positive_int), MetaKey("center", "iSTFT center", allowed=_FLAG),
              MetaKey("normalized", "iSTFT normalized", allowed=("0",)),
              MetaKey("window_type", "iSTFT window", allowed=("hann",)),
              MetaKey("pad_mode", "iSTFT padding", allowed=("reflect",))),
}


def _ports(multi: bool, scales: Sequence[Port]) -> tuple:
    ports = (Port("x", "int64", axes("N:batch L:dynamic")), Port("x_length", "int64", axes("N:batch")), *scales)
    return ports + ((Port("sid", "int64", axes("N:batch")),) if multi else ())


def vits_contract(multi: bool) -> Contract:
    """The piper/coqui VITS graph: 3 inputs, or 4 with ``sid`` (multi-speaker)."""
    return Contract(name=VITS, consumer=CONSUMER + " VITS", metadata=VITS_KEYS,
                    inputs=_ports(multi, (Port("scales", "float", axes("three:static")),)),
                    outputs=(Port("audio", "float", axes("N:batch C:static S:dynamic")),))


def matcha_contract(multi: bool) -> Contract:
    """The Matcha acoustic model with ``scales`` ``[2]``: 3 inputs (4 with ``sid``, which sherpa-onnx feeds only to
    a graph of 5 inputs: so a multi-speaker graph takes the two-scalar layout)."""
    scales = (Port("noise_scale", "float", axes("one:static")), Port("length_scale", "float", axes("one:static"))) \
        if multi else (Port("scales", "float", axes("two:static")),)
    return Contract(name=MATCHA, consumer=CONSUMER + " Matcha acoustic model", metadata=MATCHA_KEYS,
                    inputs=_ports(multi, scales), outputs=(Port("mel", "float", axes("N:batch M:static T:dynamic")),))


def vocoder_contract(kind: str) -> Contract:
    outs = (Port("audio", "float", axes("N:batch S:dynamic")),) if kind == "hifigan" else tuple(
        Port(r, "float", axes("N:batch F:static T:dynamic")) for r in ("mag", "x", "y"))
    return Contract(name=MATCHA, consumer=f"{CONSUMER} {kind} vocoder", metadata=VOCODER_KEYS[kind],
                    inputs=(Port("mel", "float", axes("N:batch M:static T:dynamic")),), outputs=outs)


def name_findings(proto, names: Mapping[int, str], what: str) -> List[Finding]:
    """sherpa-onnx's name checks: input ``i`` must be named ``names[i]`` or it is not fed as that input."""
    got = [v.name for v in proto.graph.input]
    return [Finding(f"{what} input {i} name", f"{want!r} (sherpa-onnx feeds it by this name check)",
                    repr(got[i]) if i < len(got) else "missing") for i, want in names.items()
            if i >= len(got) or got[i] != want]


@dataclass(frozen=True)
class Voice:
    """What a voice's front end is: ``tokens`` ``{symbol: id}`` (written to tokens.txt; ``" "`` is the word
    separator), ``lexicon`` ``{word: [symbol, ...]}`` (lexicon.txt), ``language``, ``punctuation`` (marks kept as
    tokens), ``add_blank``."""

    tokens: Mapping[str, int]
    lexicon: Mapping[str, Sequence[str]]
    language: str = "English"
    punctuation: str = ""
    add_blank: bool = False
    notes: List[str] = field(default_factory=list)


def tokens_text(tokens: Mapping[str, int]) -> str:
    """``symbol id`` per line; the space symbol as a line holding only its id, as sherpa-onnx reads it."""
    return "".join((f"{i}\n" if s == " " else f"{s} {i}\n") for s, i in sorted(tokens.items(), key=lambda t: t[1]))


def lexicon_text(lexicon: Mapping[str, Sequence[str]]) -> str:
    return "".join(f"{w} {' '.join(syms)}\n" for w, syms in lexicon.items())


def token_findings(variant: str, tokens: Mapping[str, int], n_vocab: int) -> List[Finding]:
    """The tokens against the variant's front ends and the model's embedding: one character per symbol (the espeak
    readers end the process on any other), ids inside the embedding, the symbols the variant looks up."""
    found = []
    long = [s for s in tokens if len(s) != 1 or s.isspace() and s != " "]
    if long:
        found.append(Finding("tokens", "one Unicode character per symbol (sherpa-onnx's piper/coqui reader ends "
                             "the process on any other)", f"symbols {long[:5]}"))
    outside = sorted((s, i) for s, i in tokens.items() if not 0 <= i < n_vocab)
    if outside:
        found.append(Finding("tokens", f"ids inside the model's {n_vocab} embeddings", f"{outside[:5]}"))
    needed = {"piper": ("_", "^", "$", " "), "coqui": (",", " ")}[variant]
    missing = [s for s in needed if s not in tokens]
    if missing:
        found.append(Finding("tokens", f"the symbols {list(needed)} sherpa-onnx's {variant} front ends look up "
                             "(a missing one aborts: std::out_of_range)", f"missing {missing}",
                             fix="add them to the voice's symbol table"))
    return found


def lexicon_findings(voice: Voice) -> List[Finding]:
    """Each lexicon word one lower-case token of no spaces, spelled with symbols tokens.txt has; each
    punctuation mark a token (sherpa-onnx looks them up with ``at()``)."""
    if not voice.lexicon:
        return [Finding("lexicon", "at least one word (sherpa-onnx's lexicon front end needs one; the proof "
                        "synthesizes lexicon words)", "no words")]
    found = []
    bad_words = [w for w in voice.lexicon if not w or w != w.lower() or any(c.isspace() for c in w)]
    if bad_words:
        found.append(Finding("lexicon words", "lower case, no spaces (sherpa-onnx lower-cases the text)",
                             f"{bad_words[:5]}"))
    unknown = sorted({s for syms in voice.lexicon.values() for s in syms if s not in voice.tokens})
    if unknown:
        found.append(Finding("lexicon", "symbols of tokens.txt only (a word with another is dropped)",
                             f"unknown symbols {unknown[:5]}"))
    empty = [w for w, syms in voice.lexicon.items() if not syms]
    if empty:
        found.append(Finding("lexicon", "at least one symbol per word", f"words {empty[:5]} have none"))
    marks = [p for p in voice.punctuation.split() if p not in voice.tokens]
    if marks:
        found.append(Finding("metadata 'punctuation'", "marks that are tokens", f"{marks}"))
    return found


def vits_metadata(voice: Voice, variant: str, sample_rate: Optional[int], n_speakers: int,
                  user: Optional[Mapping[str, str]]) -> Dict[str, str]:
    meta = {"model_type": "vits", "comment": variant, "language": voice.language,
            "n_speakers": str(n_speakers), "add_blank": "1" if voice.add_blank else "0",
            "punctuation": voice.punctuation, "maintainer": "onnx_compat"}
    if sample_rate is not None:
        meta["sample_rate"] = str(sample_rate)
    if variant == "coqui":
        meta.update(blank_id="0", bos_id="0", eos_id="0", use_eos_bos="0")
    meta.update(dict(user or {}))
    return meta


def metadata_findings(keys: Sequence[MetaKey], meta: Mapping[str, str], what: str = "") -> List[Finding]:
    return [Finding(f"{what}{f.what}", f.expected, f.got, f.fix) for key in keys
            for f in [key.finding(meta.get(key.key))] if f]


def speaker_findings(meta: Mapping[str, str], speakers: int, sids: Sequence[int]) -> List[Finding]:
    """``n_speakers`` as the model's speaker table has it, and every speaker id of the proof inside it (sherpa-onnx
    plays speaker 0 for any other, silently to the caller)."""
    found = []
    if meta.get("n_speakers") != str(speakers):
        found.append(Finding("metadata 'n_speakers'", f"{speakers} (the model's speakers)", repr(meta.get("n_speakers"))))
    outside = [s for s in sids if not 0 <= s < max(speakers, 1)]
    if outside:
        found.append(Finding("speaker id", f"inside [0, {max(speakers, 1)}) (sherpa-onnx plays speaker 0 for any "
                             "other)", f"{outside}"))
    return found


def refuse(name: str, found: List[Finding]) -> None:
    if found:
        raise ContractError(name, found)


def words(text: str) -> List[str]:
    """sherpa-onnx's ``SplitUtf8`` on lower-cased text: runs of letters/digits (and apostrophes) are words,
    every other non-space ASCII character is one word of its own."""
    text = unicodedata.normalize("NFC", text.lower())
    return re.findall(r"[^\s!-&(-/:-@\[-`{-~]+|[!-&(-/:-@\[-`{-~]", text)


def text_to_ids(text: str, voice: Voice) -> List[List[int]]:
    """The token ids of each sentence as sherpa-onnx's lexicon front end makes them (``Lexicon::
    ConvertTextToTokenIdsNotChinese``, then ``AddBlank`` when ``add_blank``); a word not in the lexicon is
    skipped (sherpa-onnx logs "OOV")."""
    blank, marks = voice.tokens[" "], set(voice.punctuation.split())
    out, current = [], []
    for w in words(text):
        if w in SPLITS or w == ",":
            if w in marks:
                current.append(voice.tokens[w])
            if w != ",":
                current.append(blank)
                out.append(current)
                current = []
            continue
        if w not in voice.lexicon:
            continue
        current += [voice.tokens[s] for s in voice.lexicon[w]] + [blank]
    if current:
        current = current[:-1]
    if current:
        out.append(current)
    if voice.add_blank:
        out = [[0] + [v for k in ids for v in (k, 0)] for ids in out]
    return out


def matcha_text_to_ids(text: str, voice: Voice, pad_id: int) -> List[int]:
    """The ids of a one-sentence text as sherpa-onnx 2.0.1's Matcha feeds them without espeak-ng data, measured
    with its debug log (its front end is not the one of the source commit read for the other families): the
    lexicon's words of the lower-cased text (others skipped, marks inside dropped), their symbols joined by the
    token ``" "``, the text's final mark when it is a token, then ``AddBlank(ids, pad_id)``. sherpa-onnx merges
    the sentences of a text by its own rule, so a proof text is one sentence."""
    ws = words(text)
    ids: List[int] = []
    for w in ws:
        if w in voice.lexicon:
            ids += ([voice.tokens[" "]] if ids else []) + [voice.tokens[s] for s in voice.lexicon[w]]
    if ids and ws and ws[-1] in voice.tokens and ws[-1] not in voice.lexicon:
        ids.append(voice.tokens[ws[-1]])
    return [pad_id] + [v for k in ids for v in (k, pad_id)] if ids else []


def one_sentence(text: str) -> bool:
    """No sentence mark before the text's last word."""
    ws = words(text)
    last = max((k for k, w in enumerate(ws) if w not in SPLITS), default=-1)
    return not any(w in SPLITS for w in ws[:last])


def matcha_metadata(voice: Voice, sample_rate: Optional[int], steps: int, pad_id: int,
                    user: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The acoustic model's keys: ``jieba`` 1 picks the lexicon front end that needs no espeak-ng data."""
    meta = {"model_type": "matcha-tts", "language": voice.language, "n_speakers": "1", "use_eos_bos": "0",
            "pad_id": str(pad_id), "jieba": "1", "has_espeak": "0", "voice": "en-us", "version": "1",
            "num_ode_steps": str(steps), "maintainer": "onnx_compat"}
    if sample_rate is not None:
        meta["sample_rate"] = str(sample_rate)
    meta.update(dict(user or {}))
    return meta


def vocoder_metadata(kind: str, vocoder, sample_rate: Optional[int]) -> Dict[str, str]:
    """``model_type`` picks the vocoder; Vocos's inverse STFT is sherpa-onnx's, set by these keys."""
    meta = {"model_type": kind, "maintainer": "onnx_compat"}
    if sample_rate is not None:
        meta["sample_rate"] = str(sample_rate)
    if kind == "vocos":
        meta.update(n_fft=str(vocoder.n_fft), hop_length=str(vocoder.hop_length),
                    win_length=str(getattr(vocoder, "win_length", vocoder.n_fft)), center="1", normalized="0",
                    window_type="hann", pad_mode="reflect")
    return meta


def mel_bins(module) -> Optional[int]:
    """A module's mel bins: its ``n_mels`` / ``n_feats``, else the input channels of its first ``Conv1d``."""
    import torch
    for attr in ("n_mels", "n_feats"):
        if isinstance(getattr(module, attr, None), int):
            return getattr(module, attr)
    conv = next((m for m in module.modules() if isinstance(m, torch.nn.Conv1d)), None)
    return conv.in_channels if conv is not None else None


def matcha_findings(acoustic, vocoder, kind: str, voice: Voice, meta: Mapping[str, str],
                    vocoder_meta: Mapping[str, str]) -> List[Finding]:
    found = [] if kind in VOCODER_KEYS else [Finding("vocoder", f"one of {list(VOCODER_KEYS)}", repr(kind))]
    found += metadata_findings(MATCHA_KEYS, meta)
    if kind in VOCODER_KEYS:
        found += metadata_findings(VOCODER_KEYS[kind], vocoder_meta, "vocoder ")
    bins, wants = mel_bins(acoustic), mel_bins(vocoder)
    if bins != wants:
        found.append(Finding("vocoder mel bins", f"{bins} (the acoustic model's mel)", f"{wants}"))
    n_vocab = acoustic.encoder.emb.num_embeddings
    outside = sorted((s, i) for s, i in voice.tokens.items() if not 0 <= i < n_vocab)
    if outside:
        found.append(Finding("tokens", f"ids inside the model's {n_vocab} embeddings", f"{outside[:5]}"))
    spaced = [s for s in voice.tokens if s != " " and (not s or any(c.isspace() for c in s))]
    if spaced:
        found.append(Finding("tokens", "symbols without whitespace (the character front end)", f"{spaced[:5]}"))
    return found + [f for f in lexicon_findings(voice) if f.what != "metadata 'punctuation'"]
