"""``pad_sequence`` over tensors whose lengths are only known at run time.

A FastSpeech-style length regulator expands each utterance with
``repeat_interleave(x, durations)`` and pads the results with
``pad_sequence``. ``repeat_interleave`` exports with either exporter (its
output length is data-dependent and stays so), but ``pad_sequence`` does not:
the TorchScript exporter has no ``aten::pad_sequence``, and the dynamo
exporter fails to decompose it over data-dependent lengths. While exporting,
each sequence is padded to the longest (a ``max`` computed in the graph) with
``F.pad`` and the results are stacked: the same values, padding and layout.

The list itself is Python: its length (the batch, when the model loops over
it) is fixed at export time. See docs/models.md, Limits.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call
from onnx_compat.patches.batch_rows import BatchRow, pad_rows
from onnx_compat.patches.unrolled_rows import lifted_rows

_PARAMS = ("sequences", "batch_first", "padding_value", "padding_side")
_DEFAULTS = {"batch_first": False, "padding_value": 0.0, "padding_side": "right"}


def _longest(lengths):
    if isinstance(lengths[0], torch.Tensor):  # TorchScript: traced sizes are 0-dim tensors
        return torch.stack(lengths).max()
    sym_max = getattr(torch, "sym_max", max)  # dynamo: data-dependent sizes must not be compared in Python
    return functools.reduce(sym_max, lengths)


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """``torch.nn.utils.rnn.pad_sequence`` with the longest length computed, not read."""
    lengths = [s.shape[0] for s in sequences]
    longest = _longest(lengths)
    padded = []
    for s, length in zip(sequences, lengths):
        amount = [0, longest - length] if padding_side == "right" else [longest - length, 0]
        padded.append(F.pad(s, [0, 0] * (s.dim() - 1) + amount, value=padding_value))
    return torch.stack(padded, dim=0 if batch_first else 1)


def _pad_sequence(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, _PARAMS, _DEFAULTS)
    if b is None or not isinstance(b["sequences"], (list, tuple)) or not b["sequences"] \
            or b["padding_side"] not in ("right", "left"):
        return wrapped(*args, **kwargs)
    seqs = b["sequences"]
    if len(seqs) == 1 and isinstance(seqs[0], BatchRow):  # a loop over a dynamic batch, lifted (batch_rows.py)
        return pad_rows(seqs[0], b["batch_first"], b["padding_value"])
    rows = lifted_rows(seqs) if b["padding_side"] == "right" else None
    if rows is not None:  # the same loop, unrolled by TorchScript (unrolled_rows.py)
        return pad_rows(rows, b["batch_first"], b["padding_value"])
    if not all(isinstance(s, torch.Tensor) and s.dim() == seqs[0].dim() >= 1 for s in seqs):
        return wrapped(*args, **kwargs)  # PyTorch's own error; unequal trailing sizes: stack raises
    return pad_sequence(seqs, b["batch_first"], b["padding_value"], b["padding_side"])


register(Patch(
    name="pad_sequence",
    description="pad_sequence over data-dependent lengths (length regulators: repeat_interleave by durations) "
                "exports under both exporters (pad to the longest, computed in the graph)",
    targets=("torch.nn.utils.rnn:pad_sequence",),
    wrapper=_pad_sequence,
    when="export",
    native={"dynamo": "2.14"},  # make test-matrix: 2.14.1's dynamo exporter exports and verifies it unpatched
))
