"""``export_whisper``: a transformers Whisper checkpoint folder written as sherpa-onnx's Whisper model, proven.

One call: ``config.json``, the weights and the tokenizer are read (any vocabulary size, mel bins, layer counts,
English-only or multilingual); the language is checked against the model's; the encoder's metadata (every key
sherpa-onnx reads) is derived and checked against the tokenizer and the logits; the encoder (any ``T``, the
cross-attention K/V of every decoder layer) and the decoder (self-attention caches, cross K/V, ``offset``) are
exported and verified at new shapes by ``export_parts``; the graphs are checked against the contract by position;
WAV files are decoded inside sherpa-onnx (Python and native) against PyTorch's greedy decode under sherpa-onnx's
pipeline (``contracts/sherpa_whisper_consumers.py``); only then are ``encoder.onnx``, ``decoder.onnx`` and the
base64 ``tokens.txt`` written. Every refusal comes before anything is written.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

import onnx
import torch

from ..contracts.base import ContractError, Finding
from ..contracts import sherpa_whisper as sw
from ..errors import ArgumentError
from ..parts.folder_report import FolderReport
from ..spec import Dim, TensorSpec
from .errors import ConfigError, UncoveredModelError, WeightsError
from .whisper_graphs import WhisperDecoderGraph, WhisperEncoderGraph

SPECIAL_TOKENS = {"sot": ("<|startoftranscript|>",), "eot": ("<|endoftext|>",), "translate": ("<|translate|>",),
                  "transcribe": ("<|transcribe|>",), "no_timestamps": ("<|notimestamps|>",),
                  "no_speech": ("<|nospeech|>", "<|nocaptions|>")}
MAX_TOKENS = 8  # tokens per decoder call in the verification (sherpa-onnx feeds at most 4, then 1)


@dataclass
class WhisperReport(FolderReport):
    """What was written (``parts``: the ``PartsReport``), the encoder's metadata, the language, the consumers' runs."""

    parts: object
    metadata: Dict[str, str]
    language: Optional[str]
    consumer_checks: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"contract": sw.NAME, "metadata": self.metadata, "language": self.language, "files": self.files,
                "consumer_checks": self.consumer_checks, "notes": self.notes, "parts": self.parts.to_dict()}

    def summary(self) -> str:
        ran = [f"{c['consumer']}: {'same tokens' if c.get('ok') else c.get('skipped')}" for c in self.consumer_checks]
        return "\n".join([f"sherpa-onnx/whisper  {self.parts.folder}",
                          f"language    {self.language or 'none (English-only)'}", *ran])


def load_whisper(folder: str):
    """``WhisperForConditionalGeneration`` with the checkpoint's weights (a tensor it lacks is refused)."""
    from .checkpoint_folder import first_line, quiet, read_model_type
    import transformers
    model_type = read_model_type(folder, None)
    fields = dict(folder=folder, task="sherpa-onnx/whisper", model_type=model_type)
    if model_type != "whisper":
        raise UncoveredModelError(f"{folder}: model type {model_type!r}: the sherpa-onnx/whisper contract takes "
                                  "Whisper checkpoints only", covered=("whisper",), **fields)
    try:
        with quiet(transformers):
            model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
                folder, local_files_only=True, output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises, one error names the folder
        raise WeightsError(f"{folder}: the weights do not load into WhisperForConditionalGeneration: "
                           f"{first_line(exc)}", **fields) from exc
    missing = list(info.get("missing_keys", ())) + [str(m[0]) if isinstance(m, (tuple, list)) else str(m)
                                                    for m in info.get("mismatched_keys", ())]
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to the token embedding
    if missing:
        raise WeightsError(f"{folder}: the checkpoint has no weights of the right shape for {missing[:4]}",
                           missing=missing, **fields)
    return model.eval()


def _byte_decoder() -> Dict[str, int]:
    """GPT-2's byte-level alphabet (each byte as a printable character), reversed: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def read_vocabulary(folder: str) -> sw.WhisperVocabulary:
    """The tokenizer in ``folder`` as sherpa-onnx needs it (``WhisperVocabulary``); a missing special is refused."""
    import transformers
    from transformers.models.whisper.tokenization_whisper import LANGUAGES
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{folder}: no Whisper tokenizer loads from the folder ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); tokens.txt is written from it",
                          folder=folder, task=sw.NAME, model_type="whisper") from exc
    vocab, added = tokenizer.get_vocab(), tokenizer.get_added_vocab()
    specials, found = {}, []
    for key, names in SPECIAL_TOKENS.items():
        ids = [vocab[n] for n in names if n in vocab]
        if ids:
            specials[key] = ids[0]
        else:
            found.append(Finding(f"tokenizer token {names[0]}", f"present (metadata {key!r})", "missing"))
    decoder, pieces, bad = _byte_decoder(), {}, []
    for piece, i in vocab.items():
        if piece in added or re.fullmatch(r"<\|.*\|>", piece):
            continue
        if all(c in decoder for c in piece):
            pieces[i] = bytes(decoder[c] for c in piece)
        else:
            bad.append(piece)
    if bad:
        found.append(Finding("tokenizer pieces", "GPT-2 byte-level spellings (tokens.txt holds their bytes)",
                             f"{bad[:3]}"))
    if found:
        raise ContractError(sw.NAME, found)
    specials["blank_id"] = vocab.get("Ġ", specials["eot"])  # read, unused by sherpa-onnx: the space, as upstream
    languages = dict(sorted(((code, vocab[f"<|{code}|>"]) for code in LANGUAGES if f"<|{code}|>" in vocab),
                            key=lambda kv: kv[1]))
    vocabulary = sw.WhisperVocabulary(pieces, specials, languages, _multilingual(folder, languages),
                                      others=frozenset(vocab.values()))
    partial = vocabulary.partial()
    if partial:
        vocabulary.notes.append(f"{len(partial)} pieces are not complete UTF-8 alone (ids {partial[:5]}...): "
                                "sherpa-onnx's Python result.tokens raises on them (use result.text), the native "
                                "binary prints a one-byte one as <0xNN>")
    return vocabulary


def _multilingual(folder: str, languages: Mapping[str, int]) -> bool:
    """``generation_config.json``'s ``is_multilingual`` (English-only checkpoints keep the language tokens), else
    whether the tokenizer has languages."""
    path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            said = json.load(fh).get("is_multilingual")
        if said is not None:
            return bool(said)
    return bool(languages)


def model_dims(model) -> Dict[str, int]:
    c = model.config
    return {"n_mels": c.num_mel_bins, "n_audio_ctx": c.max_source_positions, "n_audio_state": c.d_model,
            "n_audio_head": c.encoder_attention_heads, "n_audio_layer": c.encoder_layers,
            "n_text_ctx": c.max_target_positions, "n_text_state": c.d_model, "n_text_head": c.decoder_attention_heads,
            "n_text_layer": c.decoder_layers, "n_vocab": c.vocab_size}


def whisper_parts(model, metadata: Mapping[str, str]):
    """The encoder and decoder ``Part``s, in sherpa-onnx's port order (names as upstream's export)."""
    from ..parts import Part
    d = model_dims(model)
    layers, width, ctx = d["n_text_layer"], d["n_text_state"], d["n_text_ctx"]
    n, frames = Dim("batch"), Dim("frames")
    cache = lambda name: TensorSpec(name, [layers, n, ctx, width])  # noqa: E731
    cross = [TensorSpec(name, [layers, n, frames, width]) for name in ("n_layer_cross_k", "n_layer_cross_v")]
    encoder = Part("encoder", WhisperEncoderGraph(model),
                   [TensorSpec("mel", [n, d["n_mels"], Dim("T", min=4, max=2 * d["n_audio_ctx"], example=201)])],
                   cross, metadata=dict(metadata))
    decoder = Part("decoder", WhisperDecoderGraph(model),
                   [TensorSpec("tokens", [n, Dim("tokens", max=MAX_TOKENS, example=4)], torch.int64,
                               values=(0, d["n_vocab"])),
                    cache("in_n_layer_self_k_cache"), cache("in_n_layer_self_v_cache"),
                    TensorSpec("n_layer_cross_k", [layers, n, Dim("frames", example=23), width]),
                    TensorSpec("n_layer_cross_v", [layers, n, Dim("frames", example=23), width]),
                    TensorSpec("offset", [1], torch.int64, values=(0, ctx - MAX_TOKENS + 1))],
                   [TensorSpec("logits", [n, Dim("tokens"), d["n_vocab"]]),
                    cache("out_n_layer_self_k_cache"), cache("out_n_layer_self_v_cache")])
    return [encoder, decoder]


def _check_positions(dims: Mapping[str, int]) -> None:
    if 2 * dims["n_audio_ctx"] < sw.MAX_FRAMES:
        raise ContractError(sw.NAME, [Finding("config max_source_positions (n_audio_ctx)",
                                              f">= {sw.MAX_FRAMES // 2}: sherpa-onnx feeds up to {sw.MAX_FRAMES} "
                                              "frames (real + 1000 zero frames)", str(dims["n_audio_ctx"]))])


def export_whisper(folder, out, *, language: Optional[str] = None, exporter="auto", verify: bool = True,
                   metadata: Optional[Mapping[str, str]] = None, atol: float = 1e-4, rtol: float = 1e-3,
                   opset: Optional[int] = None) -> WhisperReport:
    """Write the Whisper checkpoint in ``folder`` into the folder ``out`` as sherpa-onnx loads it.

    ``language``: the code the export decodes with and writes into ``sot_sequence`` (default ``en`` if the model
    has it, else its first language; English-only models take none); one the model lacks is refused.
    ``metadata``: values over the derived encoder keys (checked like them). ``exporter``: one for both graphs or
    ``{"encoder": ..., "decoder": ...}``. ``verify``: decode WAV files in each installed sherpa-onnx consumer
    against PyTorch before writing (one not installed is listed with the reason).
    """
    from ..parts.export import export_parts
    folder = os.fspath(folder)
    model = load_whisper(folder)
    vocabulary = read_vocabulary(folder)
    language = sw.choose_language(vocabulary, language)
    dims = model_dims(model)
    _check_positions(dims)
    name = os.path.basename(os.path.abspath(folder))
    meta = {**sw.encoder_metadata(vocabulary, dims, language, name), **{k: str(v) for k, v in (metadata or {}).items()}}
    sw.check_metadata(meta, vocabulary, dims)
    parts = whisper_parts(model, meta)
    checks: List[dict] = []

    def judge(protos: Mapping[str, onnx.ModelProto]) -> None:
        sw.check_graphs(protos, meta)
        if verify:
            checks.extend(_in_consumers(protos, model, vocabulary, meta, language))

    report = export_parts(parts, os.fspath(out), [], exporter=exporter, atol=atol, rtol=rtol, opset=opset,
                          checks=[judge], extra_files={"tokens.txt": sw.tokens_text(vocabulary)})
    return WhisperReport(report, meta, language, checks, list(vocabulary.notes))


def reference(model, meta: Mapping[str, str], language: Optional[str]):
    """PyTorch's side of the comparison: the checkpoint's encoder (positions sliced) and its own decoder."""
    from ..contracts.sherpa_whisper_consumers import WhisperEager
    initial = sw.comma_ints(meta["sot_sequence"]) + [int(meta["no_timestamps"])]

    def logits(tokens, hidden):
        return model.proj_out(model.model.decoder(input_ids=tokens, encoder_hidden_states=hidden,
                                                   use_cache=False).last_hidden_state)[0, -1]
    return WhisperEager(WhisperEncoderGraph(model).hidden, logits, initial, int(meta["eot"]), int(meta["n_text_ctx"]))


def _in_consumers(protos, model, vocabulary, meta, language) -> List[dict]:
    """The graphs and tokens.txt as they will be written, in a temporary folder, decoded by each consumer."""
    from ..contracts.sherpa_whisper_consumers import WhisperBinary, WhisperPython
    eager, out, ids = reference(model, meta, language), [], None
    n_mels = int(meta["n_mels"])
    with tempfile.TemporaryDirectory(prefix="onnx_compat_whisper_") as tmp:
        for name, proto in protos.items():
            onnx.save(proto, os.path.join(tmp, f"{name}.onnx"))
        with open(os.path.join(tmp, "tokens.txt"), "w", encoding="utf-8") as fh:
            fh.write(sw.tokens_text(vocabulary))
        for consumer in (WhisperPython(language or ""), WhisperBinary(language or "")):
            missing = consumer.available()
            if missing:
                out.append({"consumer": consumer.name, "ok": None, "skipped": missing})
                continue
            ids = ids or consumer.reference(eager, n_mels)  # one PyTorch decode for both
            out.append(consumer.verify(tmp, eager, vocabulary, n_mels, ids))
    return out


# export()'s keywords that mean nothing here; given (not at their defaults), they are refused
_NOT_HERE = {"vocabulary": None, "quantize": None, "rasr": False, "target": None, "runtimes": (), "examples": None,
             "sizes": None, "external_data": None, "strict": False, "quantize_options": None}


def export_pretrained_whisper(folder, out, task: Optional[str] = None, *, copy_files: bool = True,
                              **export_kwargs) -> WhisperReport:
    """``export_pretrained(folder, out, contract="sherpa-onnx/whisper", ...)`` (``onnx-compat export hf:DIR
    --contract sherpa-onnx/whisper --out FOLDER``): ``out`` is the folder of encoder.onnx, decoder.onnx and
    tokens.txt; the keywords are ``export_whisper``'s (``language``, ``exporter``, ``verify``, ``metadata``,
    ``atol``, ``rtol``, ``opset``); the checkpoint's own files are not copied (sherpa-onnx reads none of them)."""
    kwargs = dict(export_kwargs)
    kwargs.pop("contract", None)
    kwargs.pop("progress", None)
    given = [k for k, default in _NOT_HERE.items() if k in kwargs and kwargs.pop(k) not in (default, [], {}, ())]
    if task is not None:
        given.insert(0, "task")
    unknown = sorted(set(kwargs) - {"language", "exporter", "verify", "metadata", "atol", "rtol", "opset"})
    if given or unknown:
        name = (given + unknown)[0]
        raise ArgumentError(f"{name!r} does not apply to contract {sw.NAME!r}: the graphs, the tokens and the metadata "
                            "come from the checkpoint folder", argument=name, value=export_kwargs.get(name, task))
    if os.fspath(out).endswith(".onnx"):
        raise ArgumentError(f"{sw.NAME!r} writes a folder (encoder.onnx, decoder.onnx, tokens.txt): give a folder, "
                            f"not {os.fspath(out)!r}", argument="out", value=os.fspath(out))
    return export_whisper(folder, out, **kwargs)
