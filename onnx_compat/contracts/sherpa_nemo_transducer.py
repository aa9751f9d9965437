"""sherpa-onnx's NeMo transducer contract (RNN-T and TDT): encoder, decoder, joiner, metadata and tokens.txt.

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9: ``offline-transducer-nemo-model.cc``,
``offline-transducer-greedy-search-nemo-decoder.cc``, ``offline-recognizer-transducer-nemo-impl.h``), measured
with the 2.0.1 wheel (``OfflineRecognizer.from_transducer(..., model_type="nemo_transducer")``; the default
``"transducer"`` sends the files to the icefall loader, which ends on the decoder's missing ``vocab_size``) and
sherpa-onnx-bin 2.0.1 (``sherpa-onnx-offline --encoder --decoder --joiner``: routed by the encoder's
``model_type``). Every graph is bound BY POSITION.

Encoder: features float ``[N, C, T]`` (sherpa-onnx transposes its ``[N, T, C]``; padded with 0 after the
per-utterance normalisation) and frame counts int64 ``[N]`` (created int64, not cast) -> ``[N, D, T']`` and the
lengths (int32 or int64), which bound the decode. Decoder: targets int32 ``[1, 1]`` (the previous token; first the
blank, V), target length int32 ``[1]`` (1), ``h`` and ``c`` float ``[pred_rnn_layers, 1, pred_hidden]`` (zeros
first) -> ``[1, H, 1]`` (fed to the joiner as is), a discarded output, next ``h`` and ``c`` (taken only when a token
is emitted). Joiner: ``([1, D, 1], [1, H, 1])`` -> logits whose flat first ``V + 1`` entries are the tokens' (the
blank last) and, TDT, the next ``K`` the durations'; the output's last dim is read from the graph at load, so it
must be static: ``vocab_size + 1`` for RNN-T (else the process ends), more for TDT.

Metadata (the encoder's): ``vocab_size`` WITHOUT the blank, ``subsampling_factor`` (timestamps),
``normalize_type`` (``per_feature``, ``""`` or ``NA``; anything else ends the process), ``pred_rnn_layers``,
``pred_hidden`` (the states' shape), ``feat_dim`` (the fbank's bins, over the caller's ``feature_dim``), ``url``
(TDT iff it contains ``tdt``), ``is_giga_am`` (the GigaAM front end when 1), ``model_type`` (the native binary's
routing: ``EncDecRNNTBPEModel`` or ``EncDecHybridRNNTCTCBPEModel``). tokens.txt: the vocabulary then ``<blk>``, its
id ``vocab_size``, the line count ``vocab_size + 1`` (else the process ends).

Greedy search: RNN-T at most 10 tokens per frame, argmax over the first ``V + 1``; TDT one joiner call per step,
the token argmax over the first ``V + 1`` and the skip = the argmax INDEX over the ``K`` duration logits (so the
durations must be ``0, 1, ..., K - 1``), at most 5 tokens per frame, a blank with skip 0 advances one frame.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from .base import Contract, ContractError, Finding, MetaKey, Port, axes, positive_int
from .sherpa_transducer import IntPort

NAME = "sherpa-onnx/nemo-transducer"
CONSUMER = ("sherpa-onnx (NeMo transducer: OfflineRecognizer.from_transducer(..., model_type='nemo_transducer'), "
            "sherpa-onnx-offline --encoder ...)")
MODEL_TYPE = "nemo_transducer"  # the Python API's model_type= (its default, "transducer", is icefall's loader)
BLANK = "<blk>"
NEMO_TYPES = ("EncDecRNNTBPEModel", "EncDecHybridRNNTCTCBPEModel")  # routes sherpa-onnx-offline to this loader
NORMALIZE_TYPES = ("per_feature", "", "NA")
GRAPHS = ("encoder", "decoder", "joiner")


@dataclass(frozen=True)
class Discarded(Port):
    """An output the consumer skips over (the decoder's length): only its presence, for the positions after it."""

    def findings(self, where: str, info):
        return [] if info is not None else super().findings(where, info)


_STATE = "L:static N:batch H:static"
_ENCODER = Contract(
    name="encoder", consumer=CONSUMER + " encoder",
    inputs=(Port("features", "float", axes("N:batch C:static T:dynamic")), Port("lengths", "int64", axes("N:batch"))),
    outputs=(Port("encoder_out", "float", axes("N:batch D:static T':dynamic")),
             IntPort("encoder_out lengths", "int64", axes("N:batch"))),
    metadata=(MetaKey("vocab_size", "tokens without the blank; sherpa-onnx adds 1", parse=positive_int),
              MetaKey("subsampling_factor", "timestamps", parse=positive_int),
              MetaKey("normalize_type", "per-utterance feature normalisation", allowed=NORMALIZE_TYPES),
              MetaKey("pred_rnn_layers", "h and c dim 0", parse=positive_int),
              MetaKey("pred_hidden", "h and c dim 2", parse=positive_int),
              MetaKey("feat_dim", "the fbank's bins (over feature_dim)", parse=positive_int),
              MetaKey("model_type", "routes sherpa-onnx-offline to its NeMo transducer loader", allowed=NEMO_TYPES),
              MetaKey("url", "TDT iff it contains 'tdt'", required=False),
              MetaKey("is_giga_am", "GigaAM's front end when 1", allowed=("0",), required=False)),
)
_DECODER = Contract(
    name="decoder", consumer=CONSUMER + " decoder",
    inputs=(Port("targets", "int32", axes("N:batch U:any")), Port("target length", "int32", axes("N:batch")),
            Port("h", "float", axes(_STATE)), Port("c", "float", axes(_STATE))),
    outputs=(Port("decoder_out", "float", axes("N:batch H:static U:any")),
             Discarded("decoder_out length", "int32", axes("N:batch")),
             Port("next h", "float", axes(_STATE)), Port("next c", "float", axes(_STATE))),
)
_JOINER = Contract(
    name="joiner", consumer=CONSUMER + " joiner",
    inputs=(Port("encoder frame", "float", axes("N:batch D:static T:any")),
            Port("decoder_out", "float", axes("N:batch H:static U:any"))),
    outputs=(Port("logits", "float", axes("N:batch T:any U:any V:static")),),
)
CONTRACTS = {"encoder": _ENCODER, "decoder": _DECODER, "joiner": _JOINER}


@dataclass(frozen=True)
class Shapes:
    """What the metadata and the graphs must agree on, read from the model: feature bins, encoder width, the
    prediction network's layers and width, the vocabulary without the blank, the durations (empty: RNN-T)."""

    feat_dim: int
    encoder_dim: int
    pred_rnn_layers: int
    pred_hidden: int
    vocab_size: int
    durations: Sequence[int] = ()

    @property
    def tdt(self) -> bool:
        return bool(self.durations)

    @property
    def width(self) -> int:
        """The joiner's last dim as sherpa-onnx checks it: tokens + blank (+ durations)."""
        return self.vocab_size + 1 + len(self.durations)


def encoder_metadata(shapes: Shapes, subsampling_factor: int, normalize_type: str,
                     user: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The encoder's metadata from the model; the user's values on top (checked by ``metadata_findings``)."""
    meta = {"vocab_size": str(shapes.vocab_size), "subsampling_factor": str(subsampling_factor),
            "normalize_type": normalize_type, "pred_rnn_layers": str(shapes.pred_rnn_layers),
            "pred_hidden": str(shapes.pred_hidden), "feat_dim": str(shapes.feat_dim), "model_type": NEMO_TYPES[0]}
    if shapes.tdt:
        meta["url"] = "onnx_compat: nemo tdt"
        meta["durations"] = ",".join(map(str, shapes.durations))  # not read by sherpa-onnx: for the reader
    meta.update({k: str(v) for k, v in (user or {}).items()})
    return meta


def metadata_findings(meta: Mapping[str, str], shapes: Shapes) -> List[Finding]:
    """Each key sherpa-onnx reads, as it reads it, against the model."""
    found = [Finding(f"encoder {f.what}", f.expected, f.got, f.fix)
             for key in _ENCODER.metadata for f in [key.finding(meta.get(key.key))] if f]
    agree = (("vocab_size", shapes.vocab_size, "the joint's classes without the blank"),
             ("pred_rnn_layers", shapes.pred_rnn_layers, "the prediction LSTM's layers"),
             ("pred_hidden", shapes.pred_hidden, "the prediction LSTM's width"),
             ("feat_dim", shapes.feat_dim, "the encoder's input channels"))
    found += [Finding(f"encoder metadata {key!r}", f"{want} ({why})", repr(meta.get(key)))
              for key, want, why in agree if key in meta and meta[key] != str(want)]
    says_tdt = "tdt" in meta.get("url", "")
    if says_tdt != shapes.tdt:
        found.append(Finding("encoder metadata 'url'", "containing 'tdt' (sherpa-onnx's only TDT switch): the joint "
                             f"has {len(shapes.durations)} duration outputs" if shapes.tdt else
                             "without 'tdt' (sherpa-onnx would decode this RNN-T as TDT and end: 'It is not a TDT "
                             "model!')", repr(meta.get("url"))))
    return found


def durations_findings(shapes: Shapes, extra_outputs: int) -> List[Finding]:
    """TDT: the joint's extra outputs are the durations, and sherpa-onnx skips the argmax's INDEX frames."""
    found = []
    if len(shapes.durations) != extra_outputs:
        found.append(Finding("durations", f"{extra_outputs} (the joint's extra outputs)",
                             f"{len(shapes.durations)} {list(shapes.durations)}"))
    if shapes.durations and list(shapes.durations) != list(range(len(shapes.durations))):
        found.append(Finding("durations", f"{list(range(len(shapes.durations)))} (sherpa-onnx skips the duration "
                             "argmax's index, not the duration)", f"{list(shapes.durations)}"))
    return found


def vocabulary_findings(vocabulary: Optional[Sequence[str]], shapes: Shapes) -> List[Finding]:
    """tokens.txt as sherpa-onnx's NeMo loader checks it: ``vocab_size + 1`` lines, ``<blk>`` once and last."""
    if vocabulary is None:
        return [Finding("vocabulary", f"{shapes.vocab_size + 1} symbols, {BLANK!r} last", "none")]
    vocab, found = list(vocabulary), []
    if len(vocab) != shapes.vocab_size + 1:
        found.append(Finding("vocabulary", f"{shapes.vocab_size + 1} symbols (the joint's {shapes.vocab_size} "
                             f"tokens, then {BLANK!r})", f"{len(vocab)}",
                             fix=f"append {BLANK!r} to the joint's vocabulary" if len(vocab) == shapes.vocab_size
                             and BLANK not in vocab else ""))
    if vocab.count(BLANK) != 1 or vocab[-1] != BLANK:
        where = [i for i, s in enumerate(vocab) if s == BLANK]
        found.append(Finding("vocabulary blank", f"{BLANK!r} once, last (id {len(vocab) - 1}: sherpa-onnx's blank "
                             "is vocab_size)", f"at {where}" if where else "none"))
    bad = [s for s in vocab if not isinstance(s, str) or not s or any(c.isspace() for c in s)]
    if bad:
        found.append(Finding("vocabulary symbols", "non-empty strings without whitespace", f"{bad[:3]}"))
    dupes = sorted({s for s in vocab if vocab.count(s) > 1 and s != BLANK}, key=str)
    if dupes:
        found.append(Finding("vocabulary symbols", "unique", f"{dupes[:3]} repeated"))
    return found


def joiner_width_findings(width, shapes: Shapes, where: str = "joiner output 0 last dim") -> List[Finding]:
    """The joiner's last dim as declared (spec) or as the graph has it: static, tokens + blank (+ durations)."""
    if not isinstance(width, int) or width != shapes.width:
        parts = f"{shapes.vocab_size} tokens + blank" + (f" + {len(shapes.durations)} durations" if shapes.tdt else "")
        return [Finding(where, f"{shapes.width} ({parts}; sherpa-onnx reads it from the graph)", repr(width))]
    return []


def check(findings: List[Finding]) -> None:
    if findings:
        raise ContractError(NAME, findings)


def check_graphs(protos, meta: Mapping[str, str], vocabulary: Sequence[str], shapes: Shapes) -> None:
    """Before writing: each graph's ports by position, the encoder's metadata, and the dims sherpa-onnx reads or
    feeds (the joiner's static width, the states' shape, the channels) as the graphs have them."""
    from onnx_compat.graph import value_info
    found: List[Finding] = []
    for graph, contract in CONTRACTS.items():
        try:
            contract.check(protos[graph], None, meta if graph == "encoder" else {})
        except ContractError as exc:
            found += [Finding(f"{graph} {f.what}", f.expected, f.got) for f in exc.findings]
    if not found:
        io = {g: ([value_info(v)["dims"] for v in protos[g].graph.input],
                  [value_info(v)["dims"] for v in protos[g].graph.output]) for g in GRAPHS}
        found += joiner_width_findings(io["joiner"][1][0][-1], shapes)
        state, wanted = io["decoder"][0][2], [shapes.pred_rnn_layers, None, shapes.pred_hidden]
        if state[0] != wanted[0] or state[2] != wanted[2]:
            found.append(Finding("decoder input 2 (h) dims", f"[{wanted[0]}, N, {wanted[2]}] (pred_rnn_layers, "
                                 "pred_hidden)", f"{state}"))
        if io["encoder"][0][0][1] != shapes.feat_dim:
            found.append(Finding("encoder input 0 dim 1 (C)", f"{shapes.feat_dim} (feat_dim)",
                                 repr(io["encoder"][0][0][1])))
    found += metadata_findings(meta, shapes) + vocabulary_findings(vocabulary, shapes)
    check(found)


def tokens_text(vocabulary: Sequence[str]) -> str:
    return "".join(f"{s} {i}\n" for i, s in enumerate(vocabulary))


@dataclass(frozen=True)
class NemoTransducerContract:
    """The contract as a table entry: its name, its consumer, a ``Contract`` per graph (``export_nemo_transducer``
    in ``onnx_compat.parts.nemo_transducer`` writes it)."""

    name: str
    consumer: str
    graphs: Mapping[str, Contract]


NEMO_TRANSDUCER = NemoTransducerContract(NAME, CONSUMER, CONTRACTS)
__all__ = ["NAME", "NEMO_TRANSDUCER", "Shapes", "check_graphs", "encoder_metadata", "metadata_findings",
           "tokens_text", "vocabulary_findings"]
