"""A length regulator's loop over the batch, unrolled by TorchScript, traced as batched graph ops.

The TorchScript exporter unrolls the loop at the example's batch (at B=1 ONNX
Runtime fails: "Split ... Cannot split using values in 'split'"), and nothing
tells it the batch is dynamic, so nothing can be refused: the rows are traced
as they come and remembered (``remember_rows``: row i of which tensor), and so
is ``repeat_interleave`` of row i by row i of durations. Then:

- when ``pad_sequence`` gets exactly those, one per row of the whole batch in
  order, it returns the batched regulation (``batch_rows.py``) instead; the
  unrolled rows feed nothing and the exporter drops them;
- padded by hand (espnet's ``pad_list``), ``Tensor.new``/``new_zeros``/
  ``new_full``/``new_empty``/``new_ones`` of row 0 with the loop's count of
  rows first gives a buffer sized by the batched regulation (its batch and
  longest length traced, not the example's), and the rows' stores
  ``buffer[i, :rows[i].size(0)] = rows[i]``, made in order, are held back until
  the last, which stores the whole regulated batch at once. A store out of
  that order lets the held ones happen as they were, then its own.

The regulated rows reach the last two through torch's function handling (a
row is handed out as ``UnrolledRow``, a view of the traced result whose other
torch calls run as on any tensor), so ``Tensor.new`` and ``__setitem__`` are
not patched for this. Any other use of the rows leaves the unrolled trace as
it was.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from onnx_compat.patches.registry import Patch, register
from ._calls import tensor_call
from .batch_rows import BatchRow, regulate, store_all

# id(a row of a loop unrolled by TorchScript) -> (the row, the tensor it is a row of, its index, rows in all);
# weak references only, so nothing outlives the trace
_rows: Dict[int, Tuple[weakref.ref, weakref.ref, int, int]] = {}
# id(repeat_interleave of row i by row i of durations) -> (that result, the batch, the durations, i, rows)
_regulated: Dict[int, Tuple[weakref.ref, weakref.ref, weakref.ref, int, int]] = {}
# id(a buffer made from row 0) -> _Buffer
_buffers: Dict[int, "_Buffer"] = {}
_NEW = ("new", "new_zeros", "new_full", "new_empty", "new_ones")


class _Buffer:
    """A buffer made from row 0 for ``regulated`` (the batched regulation): the rows' stores held back."""

    def __init__(self, buffer: torch.Tensor, regulated: BatchRow, source: Tuple[weakref.ref, weakref.ref],
                 count: int) -> None:
        self.buffer, self.regulated, self.source, self.count = weakref.ref(buffer), regulated, source, count
        self.held: List[Tuple[object, torch.Tensor]] = []


class UnrolledRow(torch.Tensor):
    """Row i's ``repeat_interleave`` of an unrolled loop: a buffer made from it or a store of it into that
    buffer is the batched regulation's; every other torch call runs as on any tensor (and gives one)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        with torch._C.DisableTorchFunctionSubclass():
            if name in _NEW and args:
                made = _buffer(name, args[0], args[1:], kwargs)
                if made is not None:
                    return made
            if name == "__setitem__" and len(args) == 3 and _store(*args):
                return None
            return func(*args, **kwargs)


def remember_rows(batch: torch.Tensor, rows):
    """``rows`` (``batch.unbind(0)`` of a Python loop, unrolled by TorchScript), each remembered as row i."""
    if len(_rows) > 4096:
        _forget_dead()
    for i, row in enumerate(rows):
        _rows[id(row)] = (weakref.ref(row), weakref.ref(batch), i, len(rows))
        row.unrolled_from = batch  # kept while its rows are: ``zip(self.proj(x), d)`` drops it at once
    return rows


def _forget_dead():
    for table in (_rows, _regulated):
        for key in [k for k, v in table.items() if v[0]() is None]:
            del table[key]
    for key in [k for k, v in _buffers.items() if v.buffer() is None]:
        del _buffers[key]


def _row(tensor):
    hit = _rows.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
    return hit if hit is not None and hit[0]() is tensor else None


def _regulated_hit(tensor):
    hit = _regulated.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
    return hit if hit is not None and hit[0]() is tensor else None


def _repeat_interleave(wrapped, instance, args, kwargs):
    """Traced as it is; the result remembered (and handed out as an ``UnrolledRow``) when it expands row i
    by row i of durations along dim 0."""
    out = wrapped(*args, **kwargs)
    b = tensor_call(instance, args, kwargs, ("input", "repeats", "dim", "output_size"),
                    {"dim": None, "output_size": None})
    if b is None or not _rows:
        return out
    row, repeats = _row(b["input"]), _row(b["repeats"])
    if row is not None and repeats is not None and b["input"].dim() >= 1 and b["dim"] in (0, -b["input"].dim()) \
            and row[2:] == repeats[2:]:
        out = out.as_subclass(UnrolledRow)
        out.unrolled_from = (row[1](), repeats[1]())  # the padding after the loop may outlive both rows
        _regulated[id(out)] = (weakref.ref(out), row[1], repeats[1], row[2], row[3])
    return out


def _whole(batch_ref, durations_ref, count: int) -> Optional[BatchRow]:
    batch, durations = batch_ref(), durations_ref()
    if batch is None or durations is None or batch.shape[0] != count:
        return None
    return regulate(BatchRow(batch), BatchRow(durations), 0)


def lifted_rows(sequences) -> Optional[BatchRow]:
    """The batched regulation of a whole unrolled loop when ``sequences`` are its rows' ``repeat_interleave``
    results, one per row in order, of one batch by one durations tensor; else None."""
    hits = [_regulated_hit(s) for s in sequences]
    if not hits or any(h is None for h in hits):
        return None
    _, batch, durations, _, count = hits[0]
    if [h[3] for h in hits] != list(range(count)) or any(h[1] is not batch or h[2] is not durations for h in hits):
        return None
    return _whole(batch, durations, count)


def _buffer(method: str, row, sizes, kwargs) -> Optional[torch.Tensor]:
    """``row.new(count, longest, *trailing)`` (or ``new_zeros``/... with the sizes as one tuple) of row 0 of
    an unrolled regulation: the same buffer with the batched regulation's batch and longest length."""
    hit = _regulated_hit(row)
    if hit is None or hit[3] != 0:
        return None
    args = ()
    if method != "new" and sizes and isinstance(sizes[0], (tuple, list, torch.Size)):
        sizes, args = tuple(sizes[0]), tuple(sizes[1:])
    regulated = _whole(hit[1], hit[2], hit[4]) if len(sizes) == row.dim() + 1 else None
    if regulated is None or not isinstance(sizes[0], int) or sizes[0] != hit[4] \
            or _values(sizes[1:]) != _values((regulated.batch.shape[1],) + tuple(row.shape[1:])):
        return None  # not the longest row's length (the example's): the model pads to something else
    traced = tuple(regulated.batch.size(d) for d in range(regulated.batch.dim()))  # none read off the rows
    made = getattr(regulated.batch, "new_empty" if method == "new" else method)(traced, *args, **kwargs)
    _buffers[id(made)] = _Buffer(made, regulated, hit[1:3], hit[4])
    return made


def _store(buffer, index, value) -> bool:
    """``buffer[i, :rows[i].size(0)] = rows[i]`` into a buffer made from row 0, row i next in order: held
    back, and at the last row the whole regulated batch stored. False when this store is not one of those
    (the held ones then happen as they were)."""
    held = _buffers.get(id(buffer)) if isinstance(buffer, torch.Tensor) else None
    if held is None or held.buffer() is not buffer:
        return False
    hit = _regulated_hit(value)
    if hit is None or hit[1]() is not held.source[0]() or hit[2]() is not held.source[1]() or hit[3] != len(held.held) or not _row_index(index, hit[3], value):
        _release(held)
        return False
    held.held.append((index, value))
    if len(held.held) == held.count:
        del _buffers[id(buffer)]
        store_all(buffer, held.regulated)
    return True


def _row_index(index, i: int, row: torch.Tensor) -> bool:
    """``index`` is ``(i, :row.size(0))`` (a trailing ``:`` or ``...`` allowed)."""
    if not isinstance(index, tuple) or len(index) < 2 or not isinstance(index[0], int) or index[0] != i:
        return False
    first = index[1]
    if not isinstance(first, slice) or first.start not in (None, 0) or first.step not in (None, 1):
        return False
    if any(t is not Ellipsis and t != slice(None) for t in index[2:]):
        return False
    return first.stop is not None and _values((first.stop,)) == _values((row.shape[0],))


def _values(sizes) -> list:
    """Traced sizes (0-d tensors) as the example's numbers, read without a "might be incorrect" warning:
    they are compared, never put in the graph."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return [int(n) for n in sizes]


def _release(held: _Buffer) -> None:
    """The held stores, made as the model made them: the rows are not stored as one regulated batch."""
    buffer = held.buffer()
    _buffers.pop(id(buffer), None)
    for index, value in held.held:
        torch._C.TensorBase.__setitem__(buffer, index, value)
    held.held.clear()


register(Patch(
    name="regulated_rows",
    description="a length regulator's loop over the batch (repeat_interleave per row, then pad_sequence or a "
                "buffer padded by hand), which TorchScript unrolls at the example's batch, is traced as batched "
                "graph ops",
    targets=("torch:repeat_interleave", "torch:Tensor.repeat_interleave"),
    wrapper=_repeat_interleave,
    when="torchscript",
    aliases=False,
    requires=("dynamic_loops", "pad_sequence"),
))
