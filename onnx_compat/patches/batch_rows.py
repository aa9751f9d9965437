"""A length regulator's loop over the batch, lifted to batched graph ops while dynamo traces.

FastSpeech-style length regulators expand each utterance on its own and pad
the results: ``pad_sequence([torch.repeat_interleave(h, d, dim=0) for h, d in
zip(x, durations)], batch_first=True)``, or by hand into a fresh buffer
(espnet's ``pad_list``: ``pad = xs[0].new(len(xs), max(x.size(0) for x in
xs), ...).fill_(v)``, then ``pad[i, :xs[i].size(0)] = xs[i]`` for each row).
The loop runs over the batch, which the dynamo exporter specialises ("Got
invalid dimensions for input" at another batch; ``dynamic_loops`` refuses it
naming the line), and the TorchScript exporter unrolls at the example's batch
(``unrolled_rows.py`` lifts it there).

While dynamo traces, iterating a tensor over a dynamic batch in model code
gives one ``BatchRow``: all rows at once. ``torch.repeat_interleave`` of a row
by a row of durations (``dim=0``) is the whole batch's regulation written as
graph ops: each output frame takes the input frame whose cumulative duration
first exceeds it, frames past an utterance's total are padding, and the
length is the longest total (computed in the graph). ``pad_sequence`` of the
one row gives that padded batch. Padded by hand, the list holds that one row:
its ``size(0)`` is the longest length (what the ``max`` over the rows takes),
a buffer made from it with ``len(rows)`` (1) rows has the batch's rows, and
storing it into ``buffer[0, :row.size(0)]`` stores every row up to its own
length, the buffer's fill past it. Anything else done with a row raises the
loop refusal naming the line, as before.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._warning_site import model_frame_outside_torch
from .when import torchscript_exporting


class BatchRow:
    """Every row of ``batch`` (dim 0 dynamic) at once; ``lengths``: each row's valid length when the rows
    were regulated (their padding is ``fill``-free until ``pad_sequence`` sets it).

    Padding by hand reads a row's sizes, makes a buffer from a row and stores each row into it (espnet's
    ``pad_list``): ``size()``/``shape`` give a row's sizes with the longest length first (what the
    ``max`` over the rows' lengths takes), ``new``/``new_zeros``/``new_full``/``new_empty``/``new_ones``
    with the list's length (1: this row stands for all) first give a real ``[B, ...]`` buffer, and
    ``buffer[0, :row.size(0)] = row`` stores every row at once (``store_row``)."""

    def __init__(self, batch: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> None:
        self.batch, self.lengths = batch, lengths

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "repeat_interleave":
            return regulate(*args, **kwargs)
        if getattr(func, "__name__", "") == "__setitem__" and len(args) == 3 and isinstance(args[2], BatchRow):
            return store_row(*args)
        raise refusal(f"torch {getattr(func, '__name__', func)} of one row of a batch")

    def size(self, dim=None):
        shape = self.shape
        return shape if dim is None else shape[dim]

    @property
    def shape(self) -> torch.Size:
        return self.batch.shape[1:]

    @property
    def dtype(self):
        return self.batch.dtype

    @property
    def device(self):
        return self.batch.device

    def dim(self) -> int:
        return self.batch.dim() - 1

    def new(self, *sizes):
        """``Tensor.new(*sizes)``, sizes only: an uninitialised buffer (the model fills it)."""
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)) else sizes
        if not sizes or not all(isinstance(n, (int, torch.SymInt)) for n in sizes):
            raise refusal("Tensor.new of one row of a batch with other than sizes")
        return self._buffer("new_empty", sizes)

    def new_empty(self, size, *rest, **kwargs):
        return self._buffer("new_empty", size, *rest, **kwargs)

    def new_zeros(self, size, *rest, **kwargs):
        return self._buffer("new_zeros", size, *rest, **kwargs)

    def new_ones(self, size, *rest, **kwargs):
        return self._buffer("new_ones", size, *rest, **kwargs)

    def new_full(self, size, fill_value, **kwargs):
        return self._buffer("new_full", size, fill_value, **kwargs)

    def _buffer(self, method: str, size, *args, **kwargs) -> torch.Tensor:
        if isinstance(size, (int, torch.SymInt)):  # new_zeros(2, 3) as well as new_zeros((2, 3))
            size, args = (size,) + tuple(a for a in args if isinstance(a, (int, torch.SymInt))), \
                tuple(a for a in args if not isinstance(a, (int, torch.SymInt)))
        size = tuple(size)
        if not size or not _same_size(size[0], 1):
            raise refusal(f"a buffer made from one row of a batch with {size[0] if size else 'no'} rows "
                          f"(the list of rows has one item standing for the whole batch: len(rows) rows)")
        return getattr(self.batch, method)((self.batch.shape[0],) + size[1:], *args, **kwargs)

    def _refused(self, *args):
        raise refusal("an operator on one row of a batch")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __matmul__ = __rmatmul__ = __getitem__ = __len__ = __iter__ = __bool__ = __neg__ = __pow__ = _refused

    def __getattr__(self, name):
        if name == "repeat_interleave":
            return lambda *args, **kwargs: regulate(self, *args, **kwargs)
        raise refusal(f"Tensor.{name} of one row of a batch")


def _same_size(a, b) -> bool:
    """Two sizes that are the same without a guard: equal ints, or symbolic sizes of one expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    expr = [getattr(getattr(n, "node", None), "expr", None) for n in (a, b)]
    return None not in expr and expr[0] == expr[1]


def store_row(buffer: torch.Tensor, index, row: BatchRow) -> None:
    """``buffer[0, :row.size(0)] = row`` where ``buffer`` was made from a row: every row of the batch stored
    into its row of the buffer, up to its own length; past it the buffer keeps its fill."""
    trailing = index[2:] if isinstance(index, tuple) else ()
    first = index[1] if isinstance(index, tuple) and len(index) > 1 else None
    if not _same_size(buffer.shape[0], row.batch.shape[0]) or not isinstance(index, tuple) or not _same_size(index[0], 0) \
            or not isinstance(first, slice) or first.start not in (None, 0) or first.step not in (None, 1) \
            or not _same_size(first.stop, row.batch.shape[1]) \
            or any(t is not Ellipsis and t != slice(None) for t in trailing):
        raise refusal(f"a row of a batch stored into a buffer of shape {tuple(buffer.shape)} at {index}: rows are "
                      f"stored as buffer[i, :rows[i].size(0)] = rows[i] into a buffer of the batch's rows, made "
                      f"from a row (rows[0].new(len(rows), longest, ...); torch.zeros(len(rows), ...) has one row)")
    store_all(buffer, row)


def store_all(buffer: torch.Tensor, row: BatchRow) -> None:
    """``buffer[:, :L] = row`` (``L`` the rows' longest length), each row up to its own length."""
    length = row.batch.shape[1]
    stored = row.batch.to(buffer.dtype)
    if row.lengths is not None:
        valid = torch.arange(length, device=row.batch.device)[None, :] < row.lengths[:, None]
        valid = valid.reshape(*valid.shape, *([1] * (row.batch.dim() - 2)))
        stored = torch.where(valid, stored, buffer[:, :length])
    torch._C.TensorBase.__setitem__(buffer, (slice(None), slice(None, length)), stored)


def refusal(what: str) -> NotImplementedError:
    from .recurrent import _refuse
    frame = model_frame_outside_torch()  # a store reaches BatchRow through torch's function handlers
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the model"
    try:
        _refuse(f"{where}: {what}: a Python loop over the dynamic batch is lifted to batched ops only for a "
                f"length regulator (repeat_interleave(h, d, dim=0) per row, then pad_sequence, or a buffer made "
                f"from a row, rows[0].new(len(rows), longest, ...), with buffer[i, :rows[i].size(0)] = rows[i] "
                f"per row); write this with tensor ops over the whole batch")
    except NotImplementedError as exc:
        return exc


def regulate(row, repeats=None, dim=None, *, output_size=None):
    if not isinstance(row, BatchRow) or not isinstance(repeats, BatchRow) or dim not in (0, -row.batch.dim() + 1) \
            or row.lengths is not None:
        raise refusal("repeat_interleave of a row other than by a row of durations along its first dim")
    x, durations = row.batch, repeats.batch.to(torch.int64)  # [B, T, ...], [B, T]
    ends = durations.cumsum(1)
    totals = ends[:, -1]
    if torchscript_exporting():
        longest = totals.max()  # a traced 0-d tensor sizes arange; item() would bake the example's number
    else:
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
