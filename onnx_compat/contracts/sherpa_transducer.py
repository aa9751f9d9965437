"""sherpa-onnx's transducer contracts: encoder, decoder and joiner as its loaders bind them, on ``export_parts``.

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9, ``sherpa-onnx/csrc/``), measured with the 2.0.1
wheel and sherpa-onnx-bin 2.0.1. Every graph is bound BY POSITION; a missing metadata key ends the process.

Offline (``offline-transducer-model.cc``; ``OfflineRecognizer.from_transducer``, ``sherpa-onnx-offline --encoder
--decoder --joiner``): encoder inputs features float ``[N, T, C]`` (not transposed) and lengths int32|int64 (cast
to the graph's type); outputs ``encoder_out`` ``[N, T', J]`` and lengths int32|int64 -- the decode reads these
lengths. Decoder: ``y`` int32|int64 ``[N, context_size]`` -> ``[N, J]``. Joiner: ``(encoder_out [n, J],
decoder_out [n, J])`` -> ``[n, V]``. Decoder metadata ``vocab_size`` (V, blank included) and ``context_size`` are
required. ``offline-recognizer-impl.cc``: the Python binding passes ``model_type="transducer"``; the native binary
without ``--model-type`` reads the encoder's ``model_type`` and takes this loader for ``conformer``, ``zipformer``
or ``zipformer2`` only (anything else, or none, ends it). ``offline-recognizer-transducer-impl.h``: a batch is
padded with -23.025850929940457. ``offline-transducer-greedy-search-decoder.cc``: the context starts at ``[-1] *
(c - 1) + [0]``, blank hard-coded 0 (``<unk>`` treated as blank), ONE joiner call per frame (LogSoftmax, argmax):
at most one label per frame; the decoder rerun when any item emitted.

Online ``lstm`` (``online-transducer-model.cc``, ``online-lstm-transducer-model.cc``; ``OnlineRecognizer.
from_transducer``, ``sherpa-onnx --encoder --decoder --joiner``): the type is the encoder's ``model_type`` (or the
config's); encoder inputs ``x`` float ``[N, T, C]``, ``h`` ``[num_encoder_layers, N, d_model]``, ``c``
``[num_encoder_layers, N, rnn_hidden_size]`` (zeros at the start; stacked and unbound on axis 1); outputs
``encoder_out`` ``[N, T', J]``, next h, next c. Required encoder metadata ``model_type=lstm``,
``num_encoder_layers``, ``T`` (frames fed per call), ``decode_chunk_len`` (frames advanced), ``rnn_hidden_size``,
``d_model``; decoder ``vocab_size``, ``context_size``. ``online-recognizer-transducer-impl.h``: a call when
``processed + T < frames``, ``processed += decode_chunk_len``. ``online-transducer-greedy-search-decoder.cc``:
one label per frame at most, blank 0, the decoder output carried across calls.

Online ``conformer`` (``online-conformer-transducer-model.cc``): encoder inputs ``x`` ``[N, T, C]``, the attention
cache ``[num_encoder_layers, left_context, N, encoder_dim]``, the convolution cache ``[num_encoder_layers,
cnn_module_kernel - 1, N, encoder_dim]`` (zeros at the start; stacked and unbound on axis 2), then
``processed_frames`` int64 ``[N]`` (feature frames fed before this call); outputs ``encoder_out``, next attention
cache, next convolution cache. Required encoder metadata ``model_type=conformer``, ``num_encoder_layers``, ``T``,
``decode_chunk_len``, ``left_context``, ``encoder_dim``, ``pad_length`` (read, not used), ``cnn_module_kernel``.

Front-end (``features.h`` defaults; the Python bindings pass rate, dim, dither 0, low 20 Hz, high -400 Hz, snip
off): Kaldi's fbank (Povey window, DC removal, pre-emphasis 0.97), samples in [-1, 1].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .base import Context, Contract, ContractError, Finding, MetaKey, Port, axes, positive_int
from .names import refused
from .sherpa_streaming import vocabulary_findings

GRAPHS = ("encoder", "decoder", "joiner")
OFFLINE_TYPES = ("conformer", "zipformer", "zipformer2")  # what the native binary routes to this loader


@dataclass(frozen=True)
class IntPort(Port):
    """An integer port the consumer casts to the graph's type: int32 or int64 both hold."""

    def findings(self, where: str, info):
        if info is not None and info["dtype"] in ("int32", "int64"):
            info = {**info, "dtype": self.dtype}
        return super().findings(where, info)

    def spec_dtype_ok(self, dtype: torch.dtype) -> bool:
        return dtype in (torch.int32, torch.int64)


def _decoder_probe(ctx: Context) -> List[Finding]:
    """The decoder runs on sherpa-onnx's start context ``[-1, ..., -1, 0]`` (``-1``: no label yet) at batch 2."""
    context = ctx.inputs[0]["dims"][1]
    start = np.array([[-1] * (context - 1) + [0]] * 2, np.int64 if ctx.inputs[0]["dtype"] == "int64" else np.int32)
    try:
        out = ctx.session().run(None, {ctx.inputs[0]["name"]: start})[0]
    except Exception as exc:  # noqa: BLE001 - the graph failing on the start context is the finding
        return [Finding("decoder on the start context [-1, ..., 0]", "runs (sherpa-onnx feeds it first)",
                        str(exc).splitlines()[0][:200])]
    if not np.isfinite(out).all():
        return [Finding("decoder on the start context [-1, ..., 0]", "finite values", "non-finite")]
    return []


def _decoder_metadata(ctx: Context) -> List[Finding]:
    """``context_size`` is the decoder's input width; ``vocab_size`` the joiner's classes (= tokens.txt)."""
    found, width = [], ctx.inputs[0]["dims"][1]
    if ctx.metadata.get("context_size") != str(width):
        found.append(Finding("decoder metadata 'context_size'", f"{width} (decoder input 0 dim 1)",
                             repr(ctx.metadata.get("context_size"))))
    classes = ctx.options.get("classes")
    if classes is not None and ctx.metadata.get("vocab_size") != str(classes):
        found.append(Finding("decoder metadata 'vocab_size'", f"{classes} (the joiner's classes, blank included)",
                             repr(ctx.metadata.get("vocab_size"))))
    return found


def _joiner_vocabulary(ctx: Context) -> List[Finding]:
    return vocabulary_findings(ctx.vocabulary, ctx.outputs[0]["dims"][1], blank_at=0)


_DECODER = Contract(
    name="decoder", consumer="sherpa-onnx transducer decoder",
    inputs=(IntPort("y", "int64", axes("N:batch context:static")),),
    outputs=(Port("decoder_out", "float", axes("N:batch J:static")),),
    metadata=(MetaKey("vocab_size", "classes incl. the blank", parse=positive_int),
              MetaKey("context_size", "labels the decoder sees", parse=positive_int)),
    probes=(_decoder_metadata, _decoder_probe),
)
_JOINER = Contract(
    name="joiner", consumer="sherpa-onnx transducer joiner",
    inputs=(Port("encoder_out frame", "float", axes("N:batch J:static")),
            Port("decoder_out", "float", axes("N:batch J:static"))),
    outputs=(Port("logit", "float", axes("N:batch V:static")),),
    probes=(_joiner_vocabulary,),
)
def _encoder_lengths(ctx: Context) -> List[Finding]:
    """sherpa-onnx decodes ``lengths[i]`` frames of item ``i`` (output 1), never asking output 0's size: a batch of
    two, the second shorter, must say at most the frames it has, and more than none."""
    sess, bins = ctx.session(), ctx.inputs[0]["dims"][2]
    lengths = np.array([48, 29], np.int64 if ctx.inputs[1]["dtype"] == "int64" else np.int32)
    features = np.random.default_rng(0).standard_normal((2, 48, bins)).astype(np.float32)
    out, said = sess.run(None, {ctx.inputs[0]["name"]: features, ctx.inputs[1]["name"]: lengths})[:2]
    said = said.reshape(-1).tolist()
    if any(not 0 < n <= out.shape[1] for n in said):
        return [Finding("encoder output 1 (lengths)", f"1..{out.shape[1]} (the frames of output 0 at T = 48, 29; "
                        "sherpa-onnx decodes that many)", f"{said}")]
    return []


_OFFLINE_ENCODER = Contract(
    name="encoder", consumer="sherpa-onnx offline transducer encoder",
    inputs=(Port("features", "float", axes("N:batch T:dynamic C:static")),
            IntPort("lengths", "int64", axes("N:batch"))),
    outputs=(Port("encoder_out", "float", axes("N:batch T':dynamic J:static")),
             IntPort("encoder_out lengths", "int64", axes("N:batch"))),
    metadata=(MetaKey("model_type", "routes sherpa-onnx-offline to its icefall transducer loader",
                      allowed=OFFLINE_TYPES),),
    probes=(_encoder_lengths,),
)
_STATE = "L:static N:batch H:static"
_LSTM_ENCODER = Contract(
    name="encoder", consumer="sherpa-onnx online lstm transducer encoder",
    inputs=(Port("x", "float", axes("N:batch T:any C:static")), Port("h", "float", axes(_STATE)),
            Port("c", "float", axes(_STATE))),
    outputs=(Port("encoder_out", "float", axes("N:batch T':any J:static")), Port("next h", "float", axes(_STATE)),
             Port("next c", "float", axes(_STATE))),
    metadata=(MetaKey("model_type", "sherpa-onnx's online model type", allowed=("lstm",)),
              *(MetaKey(k, why, parse=positive_int) for k, why in (
                  ("num_encoder_layers", "h and c dim 0"), ("T", "feature frames per call"),
                  ("decode_chunk_len", "feature frames advanced per call"), ("rnn_hidden_size", "c dim 2"),
                  ("d_model", "h dim 2")))),
)


def _lstm_keys(h, c, frames, shift) -> Dict[str, str]:
    return dict(model_type="lstm", num_encoder_layers=str(h.dims[0]), T=str(frames), decode_chunk_len=str(shift),
                rnn_hidden_size=str(c.dims[2]), d_model=str(h.dims[2]))


def _conformer_keys(attn, conv, frames, shift) -> Dict[str, str]:
    return dict(model_type="conformer", num_encoder_layers=str(attn.dims[0]), T=str(frames),
                decode_chunk_len=str(shift), left_context=str(attn.dims[1]), encoder_dim=str(attn.dims[3]),
                pad_length=str(frames - shift), cnn_module_kernel=str(conv.dims[1] + 1))


_CACHE = "L:static F:static N:batch D:static"
_CONFORMER_ENCODER = Contract(
    name="encoder", consumer="sherpa-onnx online conformer transducer encoder",
    inputs=(Port("x", "float", axes("N:batch T:any C:static")), Port("attention cache", "float", axes(_CACHE)),
            Port("convolution cache", "float", axes(_CACHE)), Port("processed frames", "int64", axes("N:batch"))),
    outputs=(Port("encoder_out", "float", axes("N:batch T':any J:static")),
             Port("next attention cache", "float", axes(_CACHE)),
             Port("next convolution cache", "float", axes(_CACHE))),
    metadata=(MetaKey("model_type", "sherpa-onnx's online model type", allowed=("conformer",)),
              *(MetaKey(k, why, parse=positive_int) for k, why in (
                  ("num_encoder_layers", "the caches' dim 0"), ("T", "feature frames per call"),
                  ("decode_chunk_len", "feature frames advanced per call"), ("left_context", "attention cache dim 1"),
                  ("encoder_dim", "the caches' dim 3"), ("cnn_module_kernel", "convolution cache dim 1 + 1"))),
              MetaKey("pad_length", "T - decode_chunk_len (read, required, unused)", parse=int)),
)


@dataclass(frozen=True)
class TransducerContract:
    """A sherpa-onnx transducer type: one ``Contract`` per graph. Online: the encoder's carried states (in
    ``states_in`` and ``states_out``), whether it also takes the processed frame count (a last input, declared as
    a state it only reads), and its metadata from those ``StateSpec``s, ``T`` and the shift."""

    name: str
    consumer: str
    graphs: Mapping[str, Contract]
    online: bool
    carried: int = 0
    processed: bool = False
    encoder_keys: Optional[object] = None  # (state, state, T, shift) -> {key: value}


OFFLINE_TRANSDUCER = TransducerContract(
    "sherpa-onnx/offline-transducer",
    "sherpa-onnx (offline transducer: OfflineRecognizer.from_transducer, sherpa-onnx-offline --encoder ...)",
    {"encoder": _OFFLINE_ENCODER, "decoder": _DECODER, "joiner": _JOINER}, online=False)
ONLINE_LSTM_TRANSDUCER = TransducerContract(
    "sherpa-onnx/online-transducer-lstm",
    "sherpa-onnx (online lstm transducer: OnlineRecognizer.from_transducer, sherpa-onnx --encoder ...)",
    {"encoder": _LSTM_ENCODER, "decoder": _DECODER, "joiner": _JOINER}, online=True, carried=2,
    encoder_keys=_lstm_keys)
ONLINE_CONFORMER_TRANSDUCER = TransducerContract(
    "sherpa-onnx/online-transducer-conformer",
    "sherpa-onnx (online conformer transducer: OnlineRecognizer.from_transducer, sherpa-onnx --encoder ...)",
    {"encoder": _CONFORMER_ENCODER, "decoder": _DECODER, "joiner": _JOINER}, online=True, carried=2,
    processed=True, encoder_keys=_conformer_keys)
TRANSDUCER_CONTRACTS = (OFFLINE_TRANSDUCER, ONLINE_LSTM_TRANSDUCER, ONLINE_CONFORMER_TRANSDUCER)


def transducer_contract(name: str) -> TransducerContract:
    for contract in TRANSDUCER_CONTRACTS:
        if contract.name == name:
            return contract
    raise refused(name, "export_transducer")


def check_graph_names(contract: TransducerContract, parts) -> None:
    names = [getattr(p, "name", None) for p in parts]
    if sorted(map(str, names)) != sorted(GRAPHS):
        raise ContractError(contract.name, [Finding("graphs", f"three Parts named {list(GRAPHS)}", f"{names}")])


def graph_metadata(contract: TransducerContract, parts, states, vocabulary, user: Mapping[str, str], shift=None):
    """Each graph's metadata: derived from its specs and the ``StateSpec``s, the user's values on top (checked)."""
    specs = {p.name: p for p in parts}
    derived: Dict[str, Dict[str, str]] = {"encoder": {}, "decoder": {}, "joiner": {}}
    y = specs["decoder"].inputs[0].dims
    derived["decoder"]["context_size"] = str(y[1])
    derived["decoder"]["vocab_size"] = str(specs["joiner"].outputs[0].dims[1])
    if contract.online:
        first, second = (next(s for s in states if s.name == n) for n in specs["encoder"].states_out[:2])
        frames = specs["encoder"].inputs[0].dims[1]
        derived["encoder"].update(contract.encoder_keys(first, second, frames, shift if shift is not None else frames))
    else:
        derived["encoder"]["model_type"] = "conformer"
    readers = {key.key: graph for graph, c in contract.graphs.items() for key in c.metadata}
    for key, value in (user or {}).items():
        derived[readers.get(key, "encoder")][key] = str(value)
    return derived


def check_ports(contract: TransducerContract, parts, states) -> None:
    """Before anything runs: each part's specs (its states after its own inputs and outputs) against its graph's
    ports by position; online, the encoder's carried states and its window a fixed size."""
    from onnx_compat.spec import TensorSpec
    table = {s.name: s for s in states}
    found: List[Finding] = []
    for part in parts:
        inputs = list(part.inputs) + [table[s].input_spec() for s in part.states_in if s in table]
        outputs = list(part.outputs) + [TensorSpec(s, table[s].dims, table[s].dtype) for s in part.states_out
                                        if s in table]
        found += [Finding(f"{part.name} {f.what}", f.expected, f.got)
                  for f in contract.graphs[part.name].check_specs(inputs, outputs)]
    encoder = next(p for p in parts if p.name == "encoder")
    carried, first, extra = (list(encoder.states_out), list(encoder.states_in)[:contract.carried],
                             list(encoder.states_in)[contract.carried:])
    if contract.online and not (len(carried) == contract.carried and first == carried
                                and len(extra) == int(contract.processed) and all(s in table for s in first + extra)):
        want = f"{contract.carried} declared StateSpecs in states_in and states_out alike" + \
            (", then the processed frame count in states_in only" if contract.processed else "")
        found.append(Finding("encoder states", want,
                             f"states_in {list(encoder.states_in)}, states_out {list(encoder.states_out)}"))
    if contract.online and encoder.inputs and len(encoder.inputs[0].dims) > 1 \
            and not isinstance(encoder.inputs[0].dims[1], int):
        found.append(Finding("encoder input 'x' dim 1 (T)", "an int: the frames sherpa-onnx feeds every call",
                             repr(encoder.inputs[0].dims[1])))
    if found:
        raise ContractError(contract.name, found)


def check_declared(contract: TransducerContract, parts, vocabulary, metadata, user) -> None:
    """Before exporting, the ports held: the decoder's context size and the joiner's classes agree with the
    metadata and tokens.txt; the blank at 0; the decoder takes sherpa-onnx's start context."""
    found: List[Finding] = []
    specs = {p.name: p for p in parts}
    width, classes = specs["decoder"].inputs[0].dims[1], specs["joiner"].outputs[0].dims[1]
    if user.get("context_size") is not None and str(user["context_size"]) != str(width):
        found.append(Finding("decoder metadata 'context_size'", f"{width} (the decoder's input y [N, {width}])",
                             repr(user["context_size"])))
    if user.get("vocab_size") is not None and str(user["vocab_size"]) != str(classes):
        found.append(Finding("decoder metadata 'vocab_size'", f"{classes} (the joiner's classes)",
                             repr(user["vocab_size"])))
    found += [Finding(f"joiner {f.what}" if f.what == "vocabulary" else f.what, f.expected, f.got)
              for f in vocabulary_findings(vocabulary, classes if isinstance(classes, int) else None, blank_at=0)]
    found += _eager_decoder_start(specs["decoder"], width)
    for graph, values in metadata.items():
        for key in contract.graphs[graph].metadata:
            wrong = key.finding(values.get(key.key))
            if wrong:
                found.append(Finding(f"{graph} {wrong.what}", wrong.expected, wrong.got))
    if found:
        raise ContractError(contract.name, found)


def _eager_decoder_start(decoder, width) -> List[Finding]:
    """The eager decoder on sherpa-onnx's first input, ``[-1, ..., -1, 0]`` (a plain ``nn.Embedding`` raises on
    -1; icefall's decoder embeds it as zeros), and its spec's values include -1 so the export is verified there."""
    found = []
    values = decoder.inputs[0].values
    if values is not None and values[0] > -1:
        found.append(Finding("decoder input 'y' values", "a range from -1 (sherpa-onnx's 'no label yet')",
                             f"{tuple(values)}"))
    start = torch.tensor([[-1] * (width - 1) + [0]] * 2, dtype=decoder.inputs[0].dtype)
    try:
        with torch.no_grad():
            decoder.fn(start)
    except Exception as exc:  # noqa: BLE001 - the model's own refusal is the finding
        found.append(Finding("decoder on the start context [-1, ..., -1, 0]", "runs (sherpa-onnx feeds it first; "
                             "embed -1 as zeros)", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
    return found


def check_graphs(contract: TransducerContract, protos, vocabulary, metadata) -> Dict[str, object]:
    """Before writing: every graph against its ports (by position), metadata and probes; one ``ContractError``."""
    applied, found = {}, []
    classes = protos["joiner"].graph.output[0].type.tensor_type.shape.dim[1].dim_value or None
    for graph in GRAPHS:
        try:
            applied[graph] = contract.graphs[graph].check(protos[graph], vocabulary, metadata[graph],
                                                          {"classes": classes})
        except ContractError as exc:
            found += [Finding(f"{graph} {f.what}", f.expected, f.got) for f in exc.findings]
    if found:
        raise ContractError(contract.name, found)
    return applied


def tokens_text(vocabulary: Sequence[str]) -> str:
    return "".join(f"{s} {i}\n" for i, s in enumerate(vocabulary))
