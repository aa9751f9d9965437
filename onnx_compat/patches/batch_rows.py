"""A length regulator's loop over the batch, lifted to batched graph ops while dynamo traces.

FastSpeech-style length regulators expand each utterance on its own and pad
the results: ``pad_sequence([torch.repeat_interleave(h, d, dim=0) for h, d in
zip(x, durations)], batch_first=True)``. The loop runs over the batch, which
the dynamo exporter specialises ("Got invalid dimensions for input" at another
batch; ``dynamic_loops`` refuses it naming the line), and the TorchScript
exporter unrolls at the example's batch.

While dynamo traces, iterating a tensor over a dynamic batch in model code
gives one ``BatchRow``: all rows at once. ``torch.repeat_interleave`` of a row
by a row of durations (``dim=0``) is the whole batch's regulation written as
graph ops: each output frame takes the input frame whose cumulative duration
first exceeds it, frames past an utterance's total are padding, and the
length is the longest total (computed in the graph). ``pad_sequence`` of the
one row gives that padded batch. Anything else done with a row raises the
loop refusal naming the line, as before.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._warning_site import model_frame


class BatchRow:
    """Every row of ``batch`` (dim 0 dynamic) at once; ``lengths``: each row's valid length when the rows
    were regulated (their padding is ``fill``-free until ``pad_sequence`` sets it)."""

    def __init__(self, batch: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> None:
        self.batch, self.lengths = batch, lengths

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "repeat_interleave":
            return _regulate(*args, **kwargs)
        raise refusal(f"torch {getattr(func, '__name__', func)} of one row of a batch")

    def _refused(self, *args):
        raise refusal("an operator on one row of a batch")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __matmul__ = __rmatmul__ = __getitem__ = __len__ = __iter__ = __bool__ = __neg__ = __pow__ = _refused

    def __getattr__(self, name):
        if name == "repeat_interleave":
            return lambda *args, **kwargs: _regulate(self, *args, **kwargs)
        raise refusal(f"Tensor.{name} of one row of a batch")


def refusal(what: str) -> NotImplementedError:
    from .recurrent import _refuse
    frame = model_frame()
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the model"
    try:
        _refuse(f"{where}: {what}: a Python loop over the dynamic batch is lifted to batched ops only for a "
                f"length regulator (repeat_interleave(h, d, dim=0) per row, then pad_sequence); write this with "
                f"tensor ops over the whole batch")
    except NotImplementedError as exc:
        return exc


def _regulate(row, repeats=None, dim=None, *, output_size=None):
    if not isinstance(row, BatchRow) or not isinstance(repeats, BatchRow) or dim not in (0, -row.batch.dim() + 1) \
            or row.lengths is not None:
        raise refusal("repeat_interleave of a row other than by a row of durations along its first dim")
    x, durations = row.batch, repeats.batch.to(torch.int64)  # [B, T, ...], [B, T]
    ends = durations.cumsum(1)
    totals = ends[:, -1]
    longest = totals.max().item()
    torch._check(longest >= 0)
    frames = torch.arange(longest, device=x.device)
    source = (ends[:, :, None] <= frames[None, None, :]).sum(1).clamp(max=x.shape[1] - 1)  # [B, L]
    gathered = torch.gather(x, 1, source.reshape(*source.shape, *([1] * (x.dim() - 2))).expand(
        -1, -1, *x.shape[2:]))
    return BatchRow(gathered, totals)


def pad_rows(row: BatchRow, batch_first: bool, padding_value) -> torch.Tensor:
    """``pad_sequence([row])``: the regulated batch with its padding set."""
    if row.lengths is None:
        padded = row.batch
    else:
        valid = torch.arange(row.batch.shape[1], device=row.batch.device)[None, :] < row.lengths[:, None]
        valid = valid.reshape(*valid.shape, *([1] * (row.batch.dim() - 2)))
        padded = torch.where(valid, row.batch, torch.full_like(row.batch, padding_value))
    return padded if batch_first else padded.transpose(0, 1)
