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

The TorchScript exporter unrolls the loop at the example's batch (at B=1 ONNX
Runtime fails: "Split ... Cannot split using values in 'split'"), and nothing
tells it the batch is dynamic, so nothing can be refused: the rows are traced
as they come and remembered (``remember_rows``: row i of which tensor), and so
is ``repeat_interleave`` of row i by row i of durations. When ``pad_sequence``
then gets exactly those, one per row of the whole batch in order, it returns
the batched regulation above instead; the unrolled rows feed nothing and the
exporter drops them. Any other use of the rows leaves the unrolled trace as it
was.
"""
from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch

from onnx_compat.patches.registry import Patch, register
from ._calls import tensor_call
from ._warning_site import model_frame
from .when import torchscript_exporting

# id(a row of a loop unrolled by TorchScript) -> (the row, the tensor it is a row of, its index, rows in all);
# weak references only, so nothing outlives the trace
_rows: Dict[int, Tuple[weakref.ref, weakref.ref, int, int]] = {}
# id(repeat_interleave of row i by row i of durations) -> (that result, the batch, the durations, i, rows)
_regulated: Dict[int, Tuple[weakref.ref, weakref.ref, weakref.ref, int, int]] = {}


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


# --- TorchScript: the unrolled loop's rows, recognised when pad_sequence gets them ------------------------

def remember_rows(batch: torch.Tensor, rows):
    """``rows`` (``batch.unbind(0)`` of a Python loop, unrolled by TorchScript), each remembered as row i."""
    if len(_rows) > 4096:
        _forget_dead()
    for i, row in enumerate(rows):
        _rows[id(row)] = (weakref.ref(row), weakref.ref(batch), i, len(rows))
    return rows


def _forget_dead():
    for table in (_rows, _regulated):
        for key in [k for k, v in table.items() if v[0]() is None]:
            del table[key]


def _row(tensor):
    hit = _rows.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
    return hit if hit is not None and hit[0]() is tensor else None


def _repeat_interleave(wrapped, instance, args, kwargs):
    """Traced as it is; the result remembered when it expands row i by row i of durations along dim 0."""
    out = wrapped(*args, **kwargs)
    b = tensor_call(instance, args, kwargs, ("input", "repeats", "dim", "output_size"),
                    {"dim": None, "output_size": None})
    if b is None or not _rows:
        return out
    row, repeats = _row(b["input"]), _row(b["repeats"])
    if row is not None and repeats is not None and b["input"].dim() >= 1 and b["dim"] in (0, -b["input"].dim()) \
            and row[2:] == repeats[2:]:
        _regulated[id(out)] = (weakref.ref(out), row[1], repeats[1], row[2], row[3])
    return out


def lifted_rows(sequences) -> Optional[BatchRow]:
    """The batched regulation of a whole unrolled loop when ``sequences`` are its rows' ``repeat_interleave``
    results, one per row in order, of one batch by one durations tensor; else None."""
    hits = [_regulated.get(id(s)) for s in sequences]
    if not hits or any(h is None or h[0]() is not s for h, s in zip(hits, sequences)):
        return None
    _, batch, durations, _, count = hits[0]
    if [h[3] for h in hits] != list(range(count)) or any(h[1] is not batch or h[2] is not durations for h in hits):
        return None
    batch, durations = batch(), durations()
    if batch is None or durations is None or batch.shape[0] != count:
        return None
    return _regulate(BatchRow(batch), BatchRow(durations), 0)


register(Patch(
    name="regulated_rows",
    description="a length regulator's loop over the batch (repeat_interleave per row, then pad_sequence), which "
                "TorchScript unrolls at the example's batch, is traced as batched graph ops",
    targets=("torch:repeat_interleave", "torch:Tensor.repeat_interleave"),
    wrapper=_repeat_interleave,
    when="torchscript",
    aliases=False,
    requires=("dynamic_loops", "pad_sequence"),
))
