"""sherpa-onnx's model contracts (facts from its C++ sources, v2.0.x; measured with sherpa-onnx 2.0.1).

Offline NeMo CTC (``offline-nemo-enc-dec-ctc-model.cc``, ``offline-recognizer-
ctc-impl.h``): input 0 gets features ``[N, C, T]`` float (padded with
log(1e-10) = -23.03 in a batch), input 1 their frame counts ``[N]`` int64;
output 0 is read as log-probs ``[N, T', V+1]`` and any other output is
ignored. ``vocab_size`` and ``subsampling_factor`` are read as integers (a
missing key ends the process), ``normalize_type`` is ``per_feature`` (NeMo's
per-bin mean/variance, done by sherpa-onnx) or ``NA``/empty (none; anything
else ends the process when the first stream is decoded). The greedy decoder
reads ``T // subsampling_factor`` frames of each item -- not the model's own
output lengths -- so a model with fewer frames makes it read past the item's
end. ``tokens.txt`` (``symbol id`` per line) must name the blank as
``<blk>``, ``<eps>`` or ``<blank>`` (looked up in that order).

Speaker embeddings, wespeaker/3d-speaker (``speaker-embedding-extractor-
model.cc``, ``...-general-impl.h``): one input ``[1, T, 80]`` float (an
80-bin fbank it computes itself), output 0 ``[1, D]``; metadata
``framework`` (``wespeaker`` or ``3d-speaker``), ``sample_rate``,
``output_dim``, ``normalize_samples`` (0: samples times 32768) and
``language`` are required, ``feature_normalize_type`` may be ``global-mean``.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from .base import (Context, Contract, ContractError, Finding, MetaKey, Port, axes, non_negative_int, positive_int)
from . import sherpa_consumers
from .sherpa_runs import BLANKS, blank_id  # noqa: F401 - their home is sherpa_runs; importable here as before
PROBE_BLOCKS = (8, 13)  # probe lengths T = factor * block + r for every remainder r


def _classes(ctx: Context) -> int:
    return ctx.outputs[0]["dims"][2]


def _frames(ctx: Context, length: int):
    """Output 0's frames and, when output 1 is per-item lengths, the model's own count, for one item of ``length``."""
    sess = ctx.session()
    names = [i.name for i in sess.get_inputs()]
    rng = np.random.default_rng(length)
    feeds = {names[0]: rng.standard_normal((1, ctx.inputs[0]["dims"][1], length)).astype(np.float32),
             names[1]: np.array([length], np.int64)}
    outs = sess.run(None, feeds)
    frames = outs[0].shape[1]
    own = int(outs[1].reshape(-1)[0]) if len(outs) > 1 and outs[1].ndim == 1 and outs[1].dtype.kind in "iu" else None
    return frames, own


def _measured_factor(ctx: Context):
    """The subsampling factor the graph shows at a long input (T / T', rounded)."""
    length = 256
    frames, own = _frames(ctx, length)
    got = min(frames, own) if own is not None else frames
    ctx.notes.append(f"subsampling_factor {round(length / max(got, 1))} measured from the graph (T={length} -> {got} frames)")
    return str(round(length / max(got, 1)))


def frames_cover_decoder(ctx: Context) -> List[Finding]:
    """sherpa-onnx decodes exactly ``T // subsampling_factor`` frames without asking the model: fewer real frames
    make it read the next item's (or no) memory, more are dropped (NeMo's "ceil" subsampling hands it
    ``ceil(T / 4)``: the last frame is lost, which shows in its tokens only when that frame carries one). Decided
    from the model's frame counts at lengths covering every remainder of the factor, never from a decode."""
    try:
        factor = int(ctx.metadata["subsampling_factor"])
    except (KeyError, ValueError):
        return []  # the metadata finding says what is wrong with it
    short, extra = [], []
    for length in sorted({factor * b + r for b in PROBE_BLOCKS for r in range(factor)}):
        try:
            frames, own = _frames(ctx, length)
        except Exception as exc:  # noqa: BLE001 - the graph not running at a length is the finding
            return [Finding(f"output 0 at T={length}", "the graph runs", str(exc).splitlines()[0])]
        real = min(frames, own) if own is not None else frames
        if real != length // factor:
            (short if real < length // factor else extra).append(f"{real} at T={length} (decodes {length // factor})")
    if not short and not extra:
        return []
    what = ("fewer: it reads past the item's end" if short else
            "more: it drops the model's last frames, and their tokens")
    return [Finding("output 0 frames", f"exactly T // subsampling_factor, the frames sherpa-onnx decodes without "
                    f"checking ({what}); to hand it exactly those, export "
                    f"onnx_compat.contracts.sherpa_onnx.floor_frames(model, {factor}) instead of the model",
                    ", ".join((short + extra)[:4]) + (" ..." if len(short + extra) > 4 else ""))]


class FloorFrames(torch.nn.Module):
    """``model`` with output 0 cut to the ``T // subsampling_factor`` frames sherpa-onnx decodes (``T``: input 0's
    last axis) and output 1, when it is per-item lengths, to each item's ``length // subsampling_factor``: the
    graph then hands sherpa-onnx exactly what it reads, and is verified against this module like any model."""

    def __init__(self, model: torch.nn.Module, subsampling_factor: int):
        super().__init__()
        if not isinstance(subsampling_factor, int) or subsampling_factor <= 0:
            raise ContractError("sherpa-onnx/nemo-ctc", [Finding("floor_frames subsampling_factor",
                                                                 "a positive int", repr(subsampling_factor))])
        self.model, self.subsampling_factor = model, subsampling_factor

    def forward(self, features: torch.Tensor, lengths: torch.Tensor, *rest):
        result = self.model(features, lengths, *rest)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        frames = features.shape[-1] // self.subsampling_factor
        outs[0] = outs[0][:, :frames]
        if len(outs) > 1 and outs[1].dim() == 1 and not outs[1].dtype.is_floating_point:
            outs[1] = torch.minimum(outs[1], torch.div(lengths, self.subsampling_factor,
                                                       rounding_mode="floor").to(outs[1].dtype))
        return tuple(outs) if isinstance(result, (tuple, list)) else outs[0]


def floor_frames(model: torch.nn.Module, subsampling_factor: int) -> FloorFrames:
    """The fix for a model with more frames than sherpa-onnx decodes (NeMo's ceil subsampling): see FloorFrames."""
    return FloorFrames(model, subsampling_factor)


def vocabulary_fits(ctx: Context) -> List[Finding]:
    """tokens.txt is written from the vocabulary: one symbol per class, the blank among them, each a single word."""
    classes, vocab = _classes(ctx), ctx.vocabulary
    if vocab is None:
        return [Finding("vocabulary", f"{classes} symbols, one per output class, with a blank {list(BLANKS)}",
                        "none (export(..., vocabulary=[...]))")]
    found = []
    if len(vocab) != classes:
        found.append(Finding("vocabulary", f"{classes} symbols (output 0 has V+1 = {classes} classes)", f"{len(vocab)}"))
    blanks = [b for b in BLANKS if b in vocab]
    if len(blanks) != 1:
        found.append(Finding("vocabulary blank", f"exactly one of {list(BLANKS)}", f"{blanks or 'none'}"))
    bad = [s for s in vocab if not isinstance(s, str) or not s or any(c.isspace() for c in s)]
    if bad:
        found.append(Finding("vocabulary symbols", "non-empty strings without whitespace", f"{bad[:3]}"))
    dupes = sorted({s for s in vocab if list(vocab).count(s) > 1}, key=str)
    if dupes:
        found.append(Finding("vocabulary symbols", "unique", f"{dupes[:3]} repeated"))
    if "vocab_size" in ctx.metadata and ctx.metadata["vocab_size"] != str(classes):
        found.append(Finding("metadata 'vocab_size'", f"{classes} (output 0's classes)", repr(ctx.metadata["vocab_size"])))
    return found


def tokens_file(ctx: Context) -> Dict[str, str]:
    return {"tokens.txt": "".join(f"{s} {i}\n" for i, s in enumerate(ctx.vocabulary))}


NEMO_CTC = Contract(
    name="sherpa-onnx/nemo-ctc",
    consumer="sherpa-onnx (offline NeMo CTC: OfflineRecognizer.from_nemo_ctc, sherpa-onnx-offline --nemo-ctc-model)",
    inputs=(Port("features", "float", axes("N:batch C:static T:dynamic")),
            Port("feature lengths", "int64", axes("N:batch"))),
    outputs=(Port("log-probs", "float", axes("N:batch T':dynamic V+1:static")),),
    metadata=(
        MetaKey("vocab_size", "output classes incl. the blank", parse=positive_int,
                derive=lambda ctx: str(_classes(ctx))),
        MetaKey("subsampling_factor", "frames per output frame", parse=positive_int, derive=_measured_factor),
        MetaKey("normalize_type", "how sherpa-onnx normalizes the features", allowed=("per_feature", "NA")),
    ),
    probes=(vocabulary_fits, frames_cover_decoder),
    files=tokens_file,
    consumers=(sherpa_consumers.NemoCtcPython(), sherpa_consumers.NemoCtcBinary()),
)


def embedding_fits(ctx: Context) -> List[Finding]:
    found = []
    bins = ctx.inputs[0]["dims"][2]
    if bins != 80:
        found.append(Finding("input 0 dim 2 (F)", "80 (sherpa-onnx's speaker front-end is an 80-bin fbank)", f"{bins}"))
    dim = ctx.outputs[0]["dims"][1]
    if ctx.metadata.get("output_dim") != str(dim):
        found.append(Finding("metadata 'output_dim'", f"{dim} (output 0's size)", repr(ctx.metadata.get("output_dim"))))
    return found


SPEAKER_EMBEDDING = Contract(
    name="sherpa-onnx/speaker-embedding",
    consumer="sherpa-onnx (SpeakerEmbeddingExtractor, wespeaker/3d-speaker models)",
    inputs=(Port("features", "float", axes("N:batch T:dynamic F:static")),),
    outputs=(Port("embedding", "float", axes("N:batch D:static")),),
    metadata=(
        MetaKey("framework", "which extractor runs it", allowed=("wespeaker", "3d-speaker")),
        MetaKey("sample_rate", "the front-end's rate", parse=positive_int),
        MetaKey("output_dim", "embedding size", parse=positive_int, derive=lambda ctx: str(ctx.outputs[0]["dims"][1])),
        MetaKey("normalize_samples", "1: samples in [-1, 1]; 0: times 32768", allowed=("0", "1"),
                parse=non_negative_int),
        MetaKey("language", "informational, but required"),
        MetaKey("feature_normalize_type", "per-utterance feature normalization", allowed=("global-mean",),
                required=False),
    ),
    probes=(embedding_fits,),
    consumers=(sherpa_consumers.SpeakerEmbeddingPython(),),
)

