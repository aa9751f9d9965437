"""The SSL encoders' sample-level padding mask reduced to frames (issue #47, 7), without its branch.

fairseq's wav2vec 2.0 and HuBERT, WavLM (unilm, and their copies in s3prl) reduce the
waveform's padding mask to the conv features' frames with one method of the encoder::

    def forward_padding_mask(self, features, padding_mask):
        extra = padding_mask.size(1) % features.size(1)
        if extra > 0:
            padding_mask = padding_mask[:, :-extra]
        padding_mask = padding_mask.view(padding_mask.size(0), features.size(1), -1)
        return padding_mask.all(-1)

``extra`` is a function of the length, and ``if extra > 0`` is decided once, at the example: both exporters keep
the example's branch (measured on torch 2.13: no error, no guard), so at every length whose samples divide into
the frames (``extra == 0``) the graph slices ``[:, :-0]``, an empty mask, and masks every frame. While either
exporter traces, such a method of the model's modules is replaced, on the instance, by the same reduction
without a branch: frame ``j`` covers samples ``[j*r, (j+1)*r)`` with ``r = samples // frames``, gathered and
reduced with ``all`` (what the trim and the view compute, at any length). A method of that name whose code does
not read ``size``, ``view`` and ``all`` is another method and is left alone.
"""
from __future__ import annotations

import contextlib
import inspect
import types
from typing import List, Tuple

import torch

from onnx_compat.patches.patch import Patch, acted, through
from onnx_compat.patches.registry import in_place, register

NAME = "padding_mask_frames"
METHOD = "forward_padding_mask"
_READS = {"size", "view", "all"}


def frames_padding_mask(features: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """``[B, samples]`` -> ``[B, frames]``: a frame is padded when all of its ``samples // frames`` samples are
    (the remainder at the end belongs to no frame), from the runtime sizes."""
    frames = features.size(1)
    per_frame = padding_mask.size(1) // frames
    starts = torch.arange(frames, device=padding_mask.device)[:, None] * per_frame
    index = starts + torch.arange(per_frame, device=padding_mask.device)[None, :]
    return padding_mask[:, index].all(-1)


def _is_the_reduction(fn) -> bool:
    """The libraries' method by its parameters and what its code reads."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    code = getattr(fn, "__code__", None)
    return params[:3] == ["self", "features", "padding_mask"] and len(params) == 3 and code is not None \
        and _READS <= set(code.co_names)


def _replace(root: torch.nn.Module) -> List[Tuple[torch.nn.Module, bool, object]]:
    """The branch-free reduction on every module of ``root`` whose class has the method; what to put back."""
    undo = []
    for module in root.modules():
        fn = getattr(type(module), METHOD, None)
        if fn is None or not _is_the_reduction(fn):
            continue
        had = METHOD in vars(module)
        undo.append((module, had, vars(module).get(METHOD)))
        # instance attribute: nn.Module keeps non-tensor values in __dict__, found before the class's method
        object.__setattr__(module, METHOD, types.MethodType(lambda self, f, m: frames_padding_mask(f, m), module))
    return undo


def _put_back(undo) -> None:
    for module, had, value in reversed(undo):
        if had:
            object.__setattr__(module, METHOD, value)
        else:
            vars(module).pop(METHOD, None)


@contextlib.contextmanager
def branch_free(root):
    """While the block runs (an export's trace: the trace hook of ``padded_lengths_int`` in ``int_calls.py`` opens
    it), the ``forward_padding_mask`` methods of ``root``'s modules are the branch-free reduction."""
    undo = _replace(root) if _wanted() and isinstance(root, torch.nn.Module) else []
    if undo:
        acted(NAME)
    try:
        yield undo
    finally:
        _put_back(undo)


def _wanted() -> bool:
    return in_place(NAME)


register(Patch(
    name=NAME,
    description="forward_padding_mask (fairseq wav2vec 2.0/HuBERT, WavLM): the sample padding mask reduced to the "
                "frames without its `if extra > 0:` trim, which both exporters decide at the example (every frame "
                "masked at lengths that divide into the frames)",
    # no target of its own: the trace hook of padded_lengths_int (int_calls.py) opens branch_free when in place
    targets=(),
    wrapper=through,
    when="export",
))
