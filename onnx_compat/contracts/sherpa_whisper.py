"""sherpa-onnx's Whisper contract: the encoder and decoder graphs, the encoder's metadata and the base64 tokens.txt.

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-whisper-model.cc``,
``offline-whisper-greedy-search-decoder.cc``, ``offline-recognizer-whisper-impl.h``), measured with the 2.0.1
wheel and sherpa-onnx-bin 2.0.1 (``OfflineRecognizer.from_whisper``, ``sherpa-onnx-offline --whisper-encoder
--whisper-decoder``). Both graphs are bound BY POSITION.

Encoder: ``mel`` float ``[N, n_mels, T]`` (``T`` = real frames + 1000 zero frames, at most 3000) -> ``n_layer_cross_k``,
``n_layer_cross_v`` ``[n_text_layer, N, T', n_text_state]``. Decoder: ``tokens`` int64 ``[N, n]`` (the whole
initial sequence first, then one token), the self-attention K and V caches ``[n_text_layer, N, n_text_ctx,
n_text_state]`` (zeros at first, each call's outputs fed back), the encoder's two outputs, ``offset`` int64 ``[1]``
(the position of ``tokens[:, 0]``) -> ``logits [N, n, V]`` (the vocabulary size is read from this shape; the last
row is argmaxed), the two caches. A decoder with 4 or more outputs is taken to return attention weights.

Metadata (the encoder's; a missing integer key ends the process, values are read with ``atoi``, so ``True``
reads as 0): ``n_mels`` (the fbank's bins), ``n_text_layer``, ``n_text_ctx``, ``n_text_state`` (the caches'
shape), ``n_vocab``, ``sot``, ``eot``, ``blank_id``, ``translate``, ``transcribe``, ``no_timestamps`` (timestamps
begin one after it), ``no_speech``, ``is_multilingual``, ``sot_sequence`` (comma ints: ``[sot, language,
transcribe]`` multilingual -- the language slot is overwritten with the chosen or detected language, the third
entry is kept unless the task is translate -- ``[sot]`` English-only) and, multilingual only,
``all_language_tokens`` / ``all_language_codes`` (comma lists of one length: the languages
``--whisper-language`` accepts; an unknown one ends the process).

tokens.txt: ``<base64 of the piece's raw bytes> <id>`` per line (sherpa-onnx decodes the base64); ids the file
lacks (the special tokens) are skipped silently in the text. The Python binding returns each piece as a ``str``:
a piece whose bytes are not complete UTF-8 alone makes it raise.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from .base import Contract, ContractError, Finding, MetaKey, Port, axes, non_negative_int, positive_int

NAME = "sherpa-onnx/whisper"
CONSUMER = "sherpa-onnx (offline Whisper: OfflineRecognizer.from_whisper, sherpa-onnx-offline --whisper-encoder ...)"
MAX_FRAMES = 3000  # sherpa-onnx feeds at most this many frames: the encoder needs MAX_FRAMES / 2 positions


def comma_ints(value: str) -> List[int]:
    return [non_negative_int(v) for v in value.split(",")]


def comma_codes(value: str) -> List[str]:
    codes = value.split(",")
    if any(not c or c != c.strip() for c in codes):
        raise ValueError(value)
    return codes


_INT_KEYS = (("n_mels", "the Whisper fbank's bins"), ("n_text_layer", "the caches' dim 0"),
             ("n_text_ctx", "the caches' dim 2; bounds the decode"), ("n_text_state", "the caches' dim 3"),
             ("n_vocab", "read, unused (the logits' shape says)"), ("sot", "<|startoftranscript|>"),
             ("eot", "<|endoftext|>: the decode stops there"), ("blank_id", "read, unused"),
             ("translate", "<|translate|>"), ("transcribe", "<|transcribe|>"),
             ("no_timestamps", "<|notimestamps|>: appended to the initial tokens"), ("no_speech", "<|nospeech|>"))
_L = "L:static N:batch"
_ENCODER = Contract(
    name="encoder", consumer=CONSUMER + " encoder",
    inputs=(Port("mel", "float", axes("N:batch n_mels:static T:dynamic")),),
    outputs=(Port("n_layer_cross_k", "float", axes(f"{_L} T':dynamic D:static")),
             Port("n_layer_cross_v", "float", axes(f"{_L} T':dynamic D:static"))),
    metadata=tuple(MetaKey(k, why, parse=positive_int if k.startswith("n_") else non_negative_int)
                   for k, why in _INT_KEYS) + (
        MetaKey("is_multilingual", "1: the language and task slots are used", allowed=("0", "1")),
        MetaKey("sot_sequence", "the initial tokens", parse=comma_ints),
        MetaKey("all_language_tokens", "the language ids (multilingual)", parse=comma_ints, required=False),
        MetaKey("all_language_codes", "the language codes (multilingual)", parse=comma_codes, required=False)),
)
_CACHE = f"{_L} ctx:static D:static"
_DECODER = Contract(
    name="decoder", consumer=CONSUMER + " decoder",
    inputs=(Port("tokens", "int64", axes("N:batch n:dynamic")),
            Port("in_n_layer_self_k_cache", "float", axes(_CACHE)),
            Port("in_n_layer_self_v_cache", "float", axes(_CACHE)),
            Port("n_layer_cross_k", "float", axes(f"{_L} T':dynamic D:static")),
            Port("n_layer_cross_v", "float", axes(f"{_L} T':dynamic D:static")),
            Port("offset", "int64", axes("one:static"))),
    outputs=(Port("logits", "float", axes("N:batch n:dynamic V:static")),
             Port("out_n_layer_self_k_cache", "float", axes(_CACHE)),
             Port("out_n_layer_self_v_cache", "float", axes(_CACHE))),
)
GRAPHS = {"encoder": _ENCODER, "decoder": _DECODER}


@dataclass(frozen=True)
class WhisperVocabulary:
    """A Whisper tokenizer as sherpa-onnx needs it: ``pieces`` ``{id: raw bytes}`` (the ordinary tokens, written to
    tokens.txt), ``specials`` ``{name: id}`` (``sot``, ``eot``, ``translate``, ``transcribe``, ``no_timestamps``,
    ``no_speech``, ``blank_id``), ``languages`` ``{code: id}`` in id order, ``multilingual``."""

    pieces: Mapping[int, bytes]
    specials: Mapping[str, int]
    languages: Mapping[str, int]
    multilingual: bool
    notes: List[str] = field(default_factory=list)
    others: frozenset = frozenset()  # the tokenizer's other ids (<|startoflm|>, timestamps, ...)

    def symbols(self, native: bool = False) -> Dict[int, str]:
        """What sherpa-onnx says for each id of tokens.txt: the bytes as UTF-8 (broken bytes replaced); ``native``:
        as ``sherpa-onnx-offline`` prints it, a one-byte piece above 0x7F as ``<0xC3>`` (``offline-stream.cc``)."""
        return {i: f"<0x{b[0]:X}>" if native and len(b) == 1 and b[0] > 0x7F else b.decode("utf-8", "replace")
                for i, b in self.pieces.items()}

    def partial(self) -> List[int]:
        """Ids whose bytes are not complete UTF-8 alone (the Python binding raises on them)."""
        out = []
        for i, b in sorted(self.pieces.items()):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                out.append(i)
        return out


def tokens_text(vocabulary: WhisperVocabulary) -> str:
    return "".join(f"{base64.b64encode(b).decode('ascii')} {i}\n" for i, b in sorted(vocabulary.pieces.items()))


def choose_language(vocabulary: WhisperVocabulary, language: Optional[str]) -> Optional[str]:
    """The language the export decodes with and writes into ``sot_sequence``: one of the model's; English-only
    models speak ``en`` only (no language slot)."""
    codes = list(vocabulary.languages)
    if not vocabulary.multilingual:
        if language not in (None, "", "en"):
            raise ContractError(NAME, [Finding("language", "'en' or none (the model is English-only: "
                                               "is_multilingual 0, no language slot)", repr(language))])
        return None
    if language is None:
        return "en" if "en" in codes else codes[0]
    if language not in codes:
        raise ContractError(NAME, [Finding("language", f"one of the model's languages {codes}", repr(language))])
    return language


def encoder_metadata(vocabulary: WhisperVocabulary, dims: Mapping[str, int], language: Optional[str],
                     model_name: str) -> Dict[str, str]:
    """Every key sherpa-onnx reads (and ``model_type``, which routes ``sherpa-onnx-offline`` when no flag does)."""
    s = vocabulary.specials
    meta = {"model_type": f"whisper-{model_name}", "version": "1", "maintainer": "onnx_compat",
            **{k: str(v) for k, v in dims.items()}, **{k: str(v) for k, v in s.items()},
            "is_multilingual": "1" if vocabulary.multilingual else "0"}
    if vocabulary.multilingual:
        meta["sot_sequence"] = f"{s['sot']},{vocabulary.languages[language]},{s['transcribe']}"
        meta["all_language_tokens"] = ",".join(str(i) for i in vocabulary.languages.values())
        meta["all_language_codes"] = ",".join(vocabulary.languages)
    else:
        meta["sot_sequence"] = str(s["sot"])
    return meta


def vocabulary_findings(vocabulary: WhisperVocabulary, classes: int) -> List[Finding]:
    """The tokenizer against the logits: every id it names inside ``[0, classes)``, every id below the first
    timestamp named (a gap is a token sherpa-onnx would decode without a symbol), the specials present."""
    found = []
    named = set(vocabulary.pieces) | set(vocabulary.specials.values()) | set(vocabulary.languages.values()) | \
        set(vocabulary.others)
    outside = sorted(i for i in named if i >= classes)
    if outside:
        found.append(Finding("vocabulary", f"ids below the logits' {classes} classes", f"ids {outside[:5]}"))
    stamps = vocabulary.specials.get("no_timestamps", classes - 1) + 1
    gaps = sorted(set(range(min(stamps, classes))) - named)
    if gaps:
        found.append(Finding("vocabulary", f"every id below the first timestamp ({stamps}) named by the tokenizer",
                             f"ids {gaps[:5]} have no token"))
    return found


def metadata_findings(meta: Mapping[str, str], vocabulary: WhisperVocabulary, dims: Mapping[str, int]) -> List[Finding]:
    """The keys' values parse as sherpa-onnx parses them and agree with the graphs and each other."""
    found = [f for key in _ENCODER.metadata for f in [key.finding(meta.get(key.key))] if f]
    for key, want in dims.items():
        if key in meta and meta[key] != str(want):
            found.append(Finding(f"metadata {key!r}", f"{want} (the graphs')", repr(meta[key])))
    if found:
        return found
    sot, multi = comma_ints(meta["sot_sequence"]), meta["is_multilingual"] == "1"
    if multi:
        absent = [k for k in ("all_language_tokens", "all_language_codes") if k not in meta]
        if absent:  # sherpa-onnx ends the process without them when is_multilingual is 1
            return [Finding(f"metadata {k!r}", "a value (is_multilingual is 1)", "missing") for k in absent]
        tokens, codes = comma_ints(meta["all_language_tokens"]), comma_codes(meta["all_language_codes"])
        if len(tokens) != len(codes):
            found.append(Finding("metadata 'all_language_tokens'/'all_language_codes'", "one code per token",
                                 f"{len(tokens)} tokens, {len(codes)} codes"))
        if len(sot) != 3 or sot[0] != int(meta["sot"]) or sot[1] not in tokens or sot[2] != int(meta["transcribe"]):
            found.append(Finding("metadata 'sot_sequence'", "[sot, a language token, transcribe] (multilingual: "
                                 "sherpa-onnx overwrites entry 1 and keeps entry 2 for transcribe)",
                                 meta["sot_sequence"]))
    elif sot != [int(meta["sot"])]:
        found.append(Finding("metadata 'sot_sequence'", "[sot] (English-only)", meta["sot_sequence"]))
    return found


def check_metadata(meta: Mapping[str, str], vocabulary: WhisperVocabulary, dims: Mapping[str, int]) -> None:
    found = metadata_findings(meta, vocabulary, dims) + vocabulary_findings(vocabulary, dims["n_vocab"])
    if found:
        raise ContractError(NAME, found)


def check_graphs(protos, meta: Mapping[str, str]) -> None:
    """Before writing: each graph's ports by position, and the dims the metadata states, as the graphs have them."""
    found: List[Finding] = []
    for graph, contract in GRAPHS.items():
        try:
            contract.check(protos[graph], None, meta if graph == "encoder" else {})
        except ContractError as exc:
            found += [Finding(f"{graph} {f.what}", f.expected, f.got) for f in exc.findings]
    if not found:
        found += _dims_agree(protos, meta)
    if found:
        raise ContractError(NAME, found)


def _dims_agree(protos, meta: Mapping[str, str]) -> List[Finding]:
    from onnx_compat.graph import value_info
    enc_in = value_info(protos["encoder"].graph.input[0])["dims"]
    cache = value_info(protos["decoder"].graph.input[1])["dims"]
    logits = value_info(protos["decoder"].graph.output[0])["dims"]
    cross = value_info(protos["encoder"].graph.output[0])["dims"]
    pairs = (("n_mels", enc_in[1], "encoder input 'mel' dim 1"), ("n_text_layer", cache[0], "decoder cache dim 0"),
             ("n_text_ctx", cache[2], "decoder cache dim 2"), ("n_text_state", cache[3], "decoder cache dim 3"),
             ("n_text_layer", cross[0], "encoder cross K dim 0"), ("n_text_state", cross[3], "encoder cross K dim 3"),
             ("n_vocab", logits[2], "decoder logits dim 2"))
    return [Finding(f"metadata {key!r}", f"{got} ({where})", repr(meta.get(key)))
            for key, got, where in pairs if meta.get(key) != str(got)]


@dataclass(frozen=True)
class WhisperContract:
    """The contract as a table entry: its name, its consumer, a ``Contract`` per graph (``export_whisper`` in
    ``onnx_compat.huggingface.whisper`` writes it)."""

    name: str
    consumer: str
    graphs: Mapping[str, Contract]


WHISPER = WhisperContract(NAME, CONSUMER, GRAPHS)
