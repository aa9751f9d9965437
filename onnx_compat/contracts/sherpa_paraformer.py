"""sherpa-onnx's offline Paraformer contract (``OfflineRecognizer.from_paraformer``, ``--paraformer``).

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-paraformer-model.cc``,
``offline-recognizer-paraformer-impl.h``, ``offline-paraformer-greedy-search-decoder.cc``, ``symbol-table.cc``),
measured with the 2.0.1 wheel and sherpa-onnx-bin 2.0.1. One graph, bound BY POSITION: ``speech`` float
``[N, T, n_mels * lfr_m]`` (LFR + CMVN, samples always times 32768), ``speech_lengths`` int32 ``[N]`` ->
``logits`` ``[N, U, V]`` (log-probs), then ``token_num`` (ignored). The greedy decode takes the argmax of every
output position of the padded batch and stops at the id of ``</s>`` in tokens.txt -- looked up with ``.at()``: a
tokens.txt without ``</s>`` aborts the process -- and ignores ``token_num``: FunASR reads each item's
``token_num`` positions instead, so a graph whose positions past an item's ``token_num`` are not ``</s>`` decodes
differently in a batch. Metadata (ints with ``atoi``, each required): ``vocab_size``, ``lfr_window_size``,
``lfr_window_shift``, ``neg_mean``, ``inv_stddev``; ``model_type`` ``paraformer`` routes ``sherpa-onnx-offline``
when no ``--paraformer`` flag names the loader.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from .base import Contract, ContractError, Finding, MetaKey, Port, axes, positive_int
from .sherpa_funasr import FrontEnd, front_end_findings, front_end_metadata, graph_findings

NAME = "sherpa-onnx/paraformer"
CONSUMER = "sherpa-onnx (offline Paraformer: OfflineRecognizer.from_paraformer, sherpa-onnx-offline --paraformer)"
EOS = "</s>"


def _comma_floats(value: str) -> List[float]:
    return [float(v) for v in value.split(",")]


GRAPH = Contract(
    name=NAME, consumer=CONSUMER,
    inputs=(Port("speech (LFR + CMVN features)", "float", axes("N:batch T:dynamic F:static")),
            Port("speech_lengths", "int32", axes("N:batch"))),
    outputs=(Port("logits", "float", axes("N:batch U:dynamic V:static")),),
    metadata=(MetaKey("vocab_size", "the logits' classes", parse=positive_int),
              MetaKey("lfr_window_size", "LFR frames stacked (lfr_m)", parse=positive_int),
              MetaKey("lfr_window_shift", "LFR step (lfr_n)", parse=positive_int),
              MetaKey("neg_mean", "CMVN shift, comma floats", parse=_comma_floats),
              MetaKey("inv_stddev", "CMVN scale, comma floats", parse=_comma_floats),
              MetaKey("model_type", "routes sherpa-onnx-offline without --paraformer", allowed=("paraformer",))),
)


def eos_id(tokens: Sequence[str], model_eos: Optional[int] = None) -> int:
    """The id sherpa-onnx stops at: ``</s>``'s in the tokens (its absence aborts sherpa-onnx), which must be the
    model's own ``eos`` (FunASR drops that id; sherpa-onnx stops at the symbol)."""
    if EOS not in tokens:
        raise ContractError(NAME, [Finding("vocabulary '</s>'", "present (sherpa-onnx stops the decode at its id; "
                                           "without it sym2id_.at('</s>') aborts the process)", "missing")])
    index = list(tokens).index(EOS)
    if model_eos is not None and int(model_eos) != index:
        raise ContractError(NAME, [Finding("vocabulary '</s>'", f"at the model's eos id {model_eos}",
                                           f"at id {index}")])
    return index


def metadata(front: FrontEnd, vocab_size: int, user: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    meta = {"model_type": "paraformer", "version": "1", "vocab_size": str(vocab_size), **front_end_metadata(front),
            "maintainer": "onnx_compat"}
    return {**meta, **{k: str(v) for k, v in (user or {}).items()}}


def metadata_findings(meta: Mapping[str, str], front: FrontEnd, classes: int) -> List[Finding]:
    """Every key parsed as sherpa-onnx parses it, ``vocab_size`` the logits' classes, LFR and CMVN the front
    end's. Run before the export and again on the graph."""
    found = [f for key in GRAPH.metadata for f in [key.finding(meta.get(key.key))] if f]
    if found:
        return found
    if meta["vocab_size"] != str(classes):
        found.append(Finding("metadata 'vocab_size'", f"{classes} (the logits' classes)", repr(meta["vocab_size"])))
    return found + front_end_findings(meta, front)


def check_metadata(meta: Mapping[str, str], front: FrontEnd, classes: int) -> None:
    found = metadata_findings(meta, front, classes)
    if found:
        raise ContractError(NAME, found)


def check(proto, meta: Mapping[str, str], front: FrontEnd) -> None:
    """Before writing: the ports by position, then ``metadata_findings`` against the graph's classes and width."""
    found, classes = graph_findings(GRAPH, proto, meta, front)
    if classes is not None:
        found += metadata_findings(meta, front, classes)
    if found:
        raise ContractError(NAME, found)
