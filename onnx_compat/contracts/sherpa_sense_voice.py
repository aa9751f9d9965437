"""sherpa-onnx's SenseVoice contract (offline, ``OfflineRecognizer.from_sense_voice``, ``--sense-voice-model``).

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-sense-voice-model.cc``,
``offline-recognizer-sense-voice-impl.h``, ``offline-ctc-greedy-search-decoder.cc``), measured with the 2.0.1 wheel
and sherpa-onnx-bin 2.0.1. One graph, bound BY POSITION: ``x`` float ``[N, T, n_mels * lfr_m]`` (LFR + CMVN
features, a batch padded with 0), ``x_length`` int32 ``[N]``, ``language`` int32 ``[N]``, ``text_norm`` int32
``[N]`` -> ``logits`` ``[N, T + 4, V]`` (the CTC output layer, no softmax; the graph prepends FunASR's four
queries -- language, event 1, emotion 2, text norm -- so sherpa-onnx decodes ``T + 4`` frames of each item).

Metadata (ints read with ``atoi``; a missing one ends the process): ``vocab_size``, ``blank_id`` (default 0),
``lfr_window_size``, ``lfr_window_shift``, ``normalize_samples`` (0: samples times 32768), ``with_itn``,
``without_itn`` (the text-norm query's ids), ``lang_auto``, ``lang_zh``, ``lang_en``, ``lang_ja``, ``lang_ko``,
``lang_yue`` (all six required: the language query's ids; an unknown ``--sense-voice-language`` falls back to 0
with a log line only), ``neg_mean``, ``inv_stddev`` (comma floats); ``comment`` containing "Nano" switches to the
FunASR-Nano loader (no queries, no CMVN, base64 tokens). The greedy CTC decode drops the first four tokens it
decodes (reported as language, emotion, event) and returns the rest.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from .base import Contract, ContractError, Finding, MetaKey, Port, axes, non_negative_int, positive_int
from .sherpa_funasr import FrontEnd, front_end_findings, front_end_metadata, graph_findings

NAME = "sherpa-onnx/sense-voice"
CONSUMER = ("sherpa-onnx (offline SenseVoice: OfflineRecognizer.from_sense_voice, "
            "sherpa-onnx-offline --sense-voice-model)")
LANGUAGES = ("auto", "zh", "en", "ja", "ko", "yue")  # the lang_* keys sherpa-onnx reads, each required
PREFIX = 4  # the queries prepended to the features; sherpa-onnx drops the first 4 decoded tokens


def _comma_floats(value: str) -> List[float]:
    return [float(v) for v in value.split(",")]


def _not_nano(value: str) -> str:
    if "Nano" in value:
        raise ValueError(value)
    return value


GRAPH = Contract(
    name=NAME, consumer=CONSUMER,
    inputs=(Port("x (LFR + CMVN features)", "float", axes("N:batch T:dynamic F:static")),
            Port("x_length", "int32", axes("N:batch")),
            Port("language", "int32", axes("N:batch")),
            Port("text_norm", "int32", axes("N:batch"))),
    outputs=(Port("logits", "float", axes("N:batch T+4:dynamic V:static")),),
    metadata=(MetaKey("vocab_size", "the logits' classes", parse=positive_int),
              MetaKey("blank_id", "the CTC blank", parse=non_negative_int),
              MetaKey("lfr_window_size", "LFR frames stacked (lfr_m)", parse=positive_int),
              MetaKey("lfr_window_shift", "LFR step (lfr_n)", parse=positive_int),
              MetaKey("normalize_samples", "0: samples times 32768", allowed=("0", "1")),
              MetaKey("with_itn", "text-norm query id with ITN", parse=non_negative_int),
              MetaKey("without_itn", "text-norm query id without ITN", parse=non_negative_int),
              *(MetaKey(f"lang_{code}", f"language query id of {code!r}", parse=non_negative_int)
                for code in LANGUAGES),
              MetaKey("neg_mean", "CMVN shift, comma floats", parse=_comma_floats),
              MetaKey("inv_stddev", "CMVN scale, comma floats", parse=_comma_floats),
              MetaKey("comment", "'Nano' in it switches to the FunASR-Nano loader", parse=_not_nano,
                      required=False)),
)


def languages(lid_dict: Mapping[str, int]) -> Dict[str, int]:
    """The model's language ids as sherpa-onnx reads them: all six keys it requires, or one refusal naming the
    missing ones (sherpa-onnx would end the process on the first)."""
    missing = [c for c in LANGUAGES if c not in lid_dict]
    if missing:
        raise ContractError(NAME, [Finding("model lid_dict", f"the ids of {list(LANGUAGES)} (sherpa-onnx reads "
                                           "lang_<code> for each; a missing one ends the process)",
                                           f"{sorted(lid_dict)}: no {missing}")])
    return {c: int(lid_dict[c]) for c in LANGUAGES}


def choose_language(lid_dict: Mapping[str, int], language: Optional[str]) -> str:
    """The language the proof decodes with (``--sense-voice-language``): one of the model's that sherpa-onnx
    knows; ``None`` is ``auto`` (sherpa-onnx's empty language is id 0, which is ``auto`` in SenseVoiceSmall)."""
    codes = languages(lid_dict)
    language = "auto" if language in (None, "") else language
    if language not in codes:
        raise ContractError(NAME, [Finding("language", f"one of the model's languages sherpa-onnx reads "
                                           f"{list(codes)} (another one is decoded as id 0 with a log line only)",
                                           repr(language))])
    return language


def metadata(front: FrontEnd, lid_dict: Mapping[str, int], textnorm_dict: Mapping[str, int], vocab_size: int,
             blank_id: int, user: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Every key sherpa-onnx reads, from the model (the user's values over them), plus what upstream also writes."""
    missing = [k for k in ("withitn", "woitn") if k not in textnorm_dict]
    if missing:
        raise ContractError(NAME, [Finding("model textnorm_dict", "the ids of 'withitn' and 'woitn' (metadata "
                                           "with_itn / without_itn)", f"no {missing}")])
    meta = {"model_type": "sense_voice_ctc", "version": "2", "vocab_size": str(vocab_size), "blank_id": str(blank_id),
            **front_end_metadata(front), "normalize_samples": "0" if front.upscale else "1",
            "with_itn": str(textnorm_dict["withitn"]), "without_itn": str(textnorm_dict["woitn"]),
            **{f"lang_{c}": str(i) for c, i in languages(lid_dict).items()},
            "lang_nospeech": str(lid_dict.get("nospeech", 13)), "maintainer": "onnx_compat"}
    return {**meta, **{k: str(v) for k, v in (user or {}).items()}}


def metadata_findings(meta: Mapping[str, str], front: FrontEnd, queries: int, classes: int) -> List[Finding]:
    """Every key parsed as sherpa-onnx parses it, and against the model: ``vocab_size`` the logits' classes, the
    CMVN and LFR the front end's, every query id a row of the embedding's ``queries``. Run before the export (a
    user's bad value costs nothing) and again on the graph."""
    found = [f for key in GRAPH.metadata for f in [key.finding(meta.get(key.key))] if f]
    if found:
        return found
    if meta["vocab_size"] != str(classes):
        found.append(Finding("metadata 'vocab_size'", f"{classes} (the logits' classes)", repr(meta["vocab_size"])))
    if int(meta["blank_id"]) >= classes:
        found.append(Finding("metadata 'blank_id'", f"below {classes}", meta["blank_id"]))
    found += front_end_findings(meta, front)
    ids = ["with_itn", "without_itn"] + [f"lang_{c}" for c in LANGUAGES]
    return found + [Finding(f"metadata {k!r}", f"a row of the query embedding (< {queries})", meta[k])
                    for k in ids if int(meta[k]) >= queries]


def check_metadata(meta: Mapping[str, str], front: FrontEnd, queries: int, classes: int) -> None:
    found = metadata_findings(meta, front, queries, classes)
    if found:
        raise ContractError(NAME, found)


def check(proto, meta: Mapping[str, str], front: FrontEnd, queries: int) -> None:
    """Before writing: the graph's ports by position, then ``metadata_findings`` against the graph's classes and
    feature width."""
    found, classes = graph_findings(GRAPH, proto, meta, front)
    if classes is not None:
        found += metadata_findings(meta, front, queries, classes)
    if found:
        raise ContractError(NAME, found)
