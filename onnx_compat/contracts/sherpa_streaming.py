"""sherpa-onnx's streaming NeMo CTC contract, for ``export_streaming(..., contract="sherpa-onnx/online-nemo-ctc")``.

Facts from sherpa-onnx's sources (k2-fsa/sherpa-onnx 634265c9, ``sherpa-onnx/csrc/``), measured with the 2.0.1
wheel and sherpa-onnx-bin 2.0.1:

- ``online-nemo-ctc-model.cc``: inputs BY POSITION: features float ``[N, C, window_size]`` (sherpa transposes its
  ``[N, T, C]`` frames), int64 ``[N]`` filled with ``window_size``, then ``cache_last_channel`` float ``[N, d1, d2,
  d3]``, ``cache_last_time`` float ``[N, e1, e2, e3]``, ``cache_last_channel_len`` int64 ``[N]``; the initial states
  are zeros of ``[1, dim1, dim2, dim3]`` from the metadata, stacked (``Cat``) and unbound on axis 0 for a batch.
  Outputs: 0 log-probs, 1 skipped, 2.. the next states in the input order. Metadata read as ints, each required
  (``SHERPA_ONNX_READ_META_DATA`` ends the process): ``window_size``, ``chunk_shift``, ``subsampling_factor``,
  ``vocab_size`` (WITHOUT the blank: 1 is added), ``cache_last_channel_dim1..3``, ``cache_last_time_dim1..3``.
- ``online-recognizer-ctc-impl.h``: a stream is ready when ``processed + window_size < frames``; each call feeds
  ``window_size`` frames from ``processed`` and adds ``chunk_shift``; every frame of output 0 is decoded (the
  model's own lengths are not read). The blank is the id of ``<blk>``/``<eps>``/``<blank>`` in tokens.txt.
- ``online-ctc-greedy-search-decoder.cc``: argmax per frame, the previous id kept across calls (one greedy CTC
  over the stream).
- Front-end (2.0.1 wheel, measured): NeMo's fbank without normalisation (``frontends.nemo_ctc_features``, "NA").
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from .base import Context, Contract, ContractError, Finding, MetaKey, Port, axes, positive_int
from .names import refused
from .sherpa_onnx import BLANKS, tokens_file
from . import sherpa_stream_consumers

STATE_NAMES = ("cache_last_channel", "cache_last_time", "cache_last_channel_len")  # NeMo's, in sherpa's order
TIME_AXIS = 2  # sherpa feeds [N, C, window]


def _state_dims(ctx: Context, k: int, axis: int) -> str:
    """A cache's dim from its ``StateSpec`` as declared (the spec is the truth the graph was checked against)."""
    return str(ctx.options["states"][k].dims[axis])


def _factor(ctx: Context) -> Optional[str]:
    frames = _frames_per_call(ctx)[0]
    shift = int(ctx.options["chunk_shift"])
    return str(max(shift // frames, 1)) if frames else None


def _cache_keys(k: int, prefix: str):
    return tuple(MetaKey(f"{prefix}_dim{a}", f"{prefix} dim {a} (its StateSpec)", parse=positive_int,
                         derive=lambda ctx, a=a: _state_dims(ctx, k, a)) for a in (1, 2, 3))


def _frames_per_call(ctx: Context):
    """Output 0's frames and output 1's count for one call from zero states (batch 1), cached."""
    if "frames" not in ctx.cache:
        sess = ctx.session()
        window, channels = int(ctx.options["window_size"]), ctx.inputs[0]["dims"][1]
        features = np.random.default_rng(0).standard_normal((1, channels, window)).astype(np.float32)
        feeds = {ctx.inputs[0]["name"]: features, ctx.inputs[1]["name"]: np.array([window], np.int64)}
        for spec, info in zip(ctx.options["states"], ctx.inputs[2:]):
            shape = [1, *spec.dims[1:]]
            feeds[info["name"]] = np.zeros(shape, np.int64 if info["dtype"] == "int64" else np.float32)
        outs = sess.run(None, feeds)
        own = outs[1].reshape(-1)
        ctx.cache["frames"] = (outs[0].shape[1], int(own[0]) if own.size else None, outs[0].shape[2])
    return ctx.cache["frames"]


def frames_are_what_sherpa_reads(ctx: Context) -> List[Finding]:
    """sherpa-onnx decodes every frame of output 0 and advances ``chunk_shift`` feature frames per call: a model that
    says fewer frames are valid (output 1) gets its invalid ones decoded; one whose frames do not cover exactly the
    shift emits them twice or skips some."""
    frames, own, _ = _frames_per_call(ctx)
    try:
        factor, shift = positive_int(ctx.metadata["subsampling_factor"]), positive_int(ctx.metadata["chunk_shift"])
    except (KeyError, ValueError):
        return []  # the metadata key's own finding says why
    found = []
    if own is not None and own != frames:
        found.append(Finding("output 1 (frame count)", f"{frames}, the frames of output 0 that sherpa-onnx decodes "
                             "every call (it never reads output 1)", f"{own}"))
    if frames * factor != shift:
        found.append(_shift_finding(ctx, frames, factor, shift))
    return found


def _shift_finding(ctx: Context, frames: int, factor: int, shift: int) -> Finding:
    """sherpa-onnx advances ``shift`` feature frames per call and decodes all ``frames`` output frames of it, so
    ``shift`` = ``frames`` x the subsampling factor: the finding says what was declared (``shift=``, the factor
    given or derived), what was measured (the frames of one call) and which value to change."""
    window = int(ctx.options["window_size"])
    given = ctx.metadata.get("subsampling_factor") != _factor(ctx)
    factor_said = "given in metadata" if given else f"derived as shift // frames = {shift} // {frames}"
    if not frames:
        fix = f"chunk= (window_size {window} gives no output frame, so nothing is decoded)"
    elif shift % frames == 0:
        fix = f"subsampling_factor={shift // frames}, or leave it out (it is derived from shift= and the frames per call)"
    else:
        guess = max(window // frames, 1)
        fix = (f"shift={frames * guess}: sherpa-onnx decodes all {frames} frames of every call, so shift= must be {frames}"
               f" x the subsampling factor ({shift} is no multiple of {frames}; {guess} = window_size {window} // "
               f"{frames}), else chunk= for a window whose frames per call fit shift=")
    return Finding("output 0 frames per call", f"{shift / factor:g} (shift={shift} declared / subsampling_factor="
                   f"{factor}, {factor_said})", f"{frames} (measured: one call on window_size={window} feature frames)",
                   fix)


def vocabulary_fits(ctx: Context) -> List[Finding]:
    """tokens.txt from the vocabulary: one symbol per class, exactly one blank; ``vocab_size`` = classes - 1."""
    classes = _frames_per_call(ctx)[2]
    found = vocabulary_findings(ctx.vocabulary, classes)
    if ctx.metadata.get("vocab_size") != str(classes - 1):
        found.append(Finding("metadata 'vocab_size'", f"{classes - 1} (output 0's {classes} classes without the blank: "
                             "sherpa-onnx adds 1)", repr(ctx.metadata.get("vocab_size"))))
    return found


def vocabulary_findings(vocab, classes: Optional[int], blank_at: Optional[int] = None) -> List[Finding]:
    """The vocabulary rules every sherpa-onnx contract shares; ``blank_at``: where the consumer hard-codes it."""
    if vocab is None:
        return [Finding("vocabulary", f"{classes or 'V+1'} symbols with one blank {list(BLANKS)}",
                        "none (vocabulary=[...])")]
    vocab, found = list(vocab), []
    if classes is not None and len(vocab) != classes:
        found.append(Finding("vocabulary", f"{classes} symbols (the model's classes)", f"{len(vocab)}"))
    blanks = [b for b in BLANKS if b in vocab]
    if len(blanks) != 1:
        found.append(Finding("vocabulary blank", f"exactly one of {list(BLANKS)}", f"{blanks or 'none'}"))
    elif blank_at is not None and vocab.index(blanks[0]) != blank_at:
        found.append(Finding("vocabulary blank", f"{blanks[0]!r} at index {blank_at} (sherpa-onnx hard-codes it)",
                             f"at index {vocab.index(blanks[0])}"))
    bad = [s for s in vocab if not isinstance(s, str) or not s or any(c.isspace() for c in s)]
    if bad:
        found.append(Finding("vocabulary symbols", "non-empty strings without whitespace", f"{bad[:3]}"))
    dupes = sorted({s for s in vocab if vocab.count(s) > 1}, key=str)
    if dupes:
        found.append(Finding("vocabulary symbols", "unique", f"{dupes[:3]} repeated"))
    return found


def metadata_agrees(ctx: Context) -> List[Finding]:
    """A value the user gave where the contract derives one (from the StateSpecs, chunk= and shift=) must agree."""
    found = []
    for key in ONLINE_NEMO_CTC.metadata:
        if key.derive is None or key.key == "subsampling_factor":
            continue
        derived = key.derive(ctx)
        if ctx.metadata.get(key.key) != derived:
            found.append(Finding(f"metadata {key.key!r}", f"{derived} ({key.why})", repr(ctx.metadata.get(key.key))))
    return found


_STATE = "N:batch D1:static D2:static D3:static"

ONLINE_NEMO_CTC = Contract(
    name="sherpa-onnx/online-nemo-ctc",
    consumer="sherpa-onnx (streaming NeMo CTC: OnlineRecognizer.from_nemo_ctc, sherpa-onnx --nemo-ctc-model)",
    inputs=(Port("features", "float", axes("N:batch C:static T:any")),  # symbolic, or window_size itself
            Port("window length", "int64", axes("N:batch")),
            Port("cache_last_channel", "float", axes(_STATE)),
            Port("cache_last_time", "float", axes(_STATE)),
            Port("cache_last_channel_len", "int64", axes("N:batch"))),
    outputs=(Port("log-probs", "float", axes("N:batch T':any V+1:static")),
             Port("frame count (skipped by sherpa-onnx)", "int64", axes("N:batch")),
             Port("next cache_last_channel", "float", axes(_STATE)),
             Port("next cache_last_time", "float", axes(_STATE)),
             Port("next cache_last_channel_len", "int64", axes("N:batch"))),
    metadata=(
        MetaKey("window_size", "feature frames per call: chunk=", parse=positive_int,
                derive=lambda ctx: str(ctx.options["window_size"])),
        MetaKey("chunk_shift", "feature frames the stream advances per call: shift=", parse=positive_int,
                derive=lambda ctx: str(ctx.options["chunk_shift"])),
        MetaKey("subsampling_factor", "feature frames per output frame", parse=positive_int, derive=_factor),
        MetaKey("vocab_size", "classes without the blank", parse=positive_int,
                derive=lambda ctx: str(_frames_per_call(ctx)[2] - 1)),
        *_cache_keys(0, "cache_last_channel"),
        *_cache_keys(1, "cache_last_time"),
    ),
    probes=(metadata_agrees, vocabulary_fits, frames_are_what_sherpa_reads),
    files=tokens_file,
    consumers=(sherpa_stream_consumers.OnlineNemoCtcPython(), sherpa_stream_consumers.OnlineNemoCtcBinary()),
)


def check_declared(contract: Contract, inputs, states, outputs, time_axis: int, vocabulary) -> None:
    """Before the eager pre-pass: the declared chunk inputs, ``StateSpec``s and outputs can satisfy sherpa-onnx's
    streaming contract -- one ``ContractError`` listing every finding, nothing run or written."""
    from onnx_compat.spec import TensorSpec
    state_inputs = [s.input_spec() for s in states]
    state_outputs = [TensorSpec(s.output, s.dims, s.dtype) for s in states]
    found = contract.check_specs(list(inputs) + state_inputs, list(outputs) + state_outputs)
    names = [s.name for s in states]
    if len(names) != len(STATE_NAMES):
        found.append(Finding("states", f"{len(STATE_NAMES)} in this order: {list(STATE_NAMES)}", f"{names}"))
    elif set(names) == set(STATE_NAMES) and names != list(STATE_NAMES):
        found.append(Finding("states order", f"{list(STATE_NAMES)} (sherpa-onnx feeds them by position)", f"{names}"))
    outs = [n for s in outputs for n in s.onnx_names]
    if len(outs) != 2:
        found.append(Finding("outputs before the states", "exactly 2: log-probs and their frame count (sherpa-onnx "
                             "skips output 1 and reads the next states from output 2 on)", f"{outs}"))
    if time_axis != TIME_AXIS:
        found.append(Finding("time_axis", f"{TIME_AXIS} (features [N, C, window])", f"{time_axis}"))
    classes = outputs[0].dims[-1] if outputs and isinstance(outputs[0].dims[-1], int) else None
    found += vocabulary_findings(vocabulary, classes)
    if found:
        raise ContractError(contract.name, found)


def apply_streaming(contract: Contract, proto, states, window: int, shift: int, vocabulary,
                    metadata: Optional[Dict[str, str]] = None):
    """Before writing: the graph against the contract, its metadata derived and set on ``proto``; returns ``Applied``
    (``files``: tokens.txt) or raises ``ContractError`` with ``proto`` unchanged."""
    from ..graph import set_metadata
    options = {"states": list(states), "window_size": window, "chunk_shift": shift}
    applied = contract.check(proto, vocabulary, metadata, options)
    set_metadata(proto, applied.metadata)
    return applied


def streaming_contract(name: Optional[str]) -> Optional[Contract]:
    if name is None:
        return None
    for contract in STREAMING_CONTRACTS:
        if contract.name == name:
            return contract
    raise refused(name, "export_streaming")


STREAMING_CONTRACTS = (ONLINE_NEMO_CTC,)
