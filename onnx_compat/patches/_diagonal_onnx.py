"""ONNX translations of ``aten::diagonal`` and ``aten::diagonal_scatter`` that never multiply by zero.

Why the dynamo exporter needs them (torch 2.13, onnxscript's torchlib): torchlib writes ``diagonal`` as
``EyeLike -> Mul -> ReduceSum``, so an infinity off the diagonal becomes ``inf * 0 = NaN`` in its row, and has no
``diagonal_scatter`` at all, so torch.onnx decomposes it with torch's reference, whose in-place ``copy_to`` stops
the export ("aot_autograd expected to have an entirely functional graph"). A write through a diagonal view
(``x.diagonal(0, -2, -1).fill_(0.0)``: torch-struct's ``semiring.one_``) is functionalized by torch.export into
``diagonal_scatter``: with this translation it exports, as the view it is in eager.

Both work on the two dims moved last (``Transpose``), as torch lays a diagonal out: the remaining dims in their
order, then the diagonal. Called by the exporter while it builds the graph, on graph values; ranks, dims and
offsets are plain Python values.
"""
from __future__ import annotations

from typing import List, Tuple

from onnxscript import opset18 as op

from onnx_compat.patches._diagonal_layout import last_two

_END = 2 ** 62  # a Slice end past any size


def _moved_last(rank: int, dim1: int, dim2: int) -> Tuple[List[int], List[int]]:
    """The permutation that moves ``dim1``, ``dim2`` last (torch's layout of a diagonal) and its
    inverse."""
    perm = last_two(rank, dim1 % rank, dim2 % rank)
    return perm, [perm.index(d) for d in range(rank)]


def _size(x, axis: int):
    """Dim ``axis`` of ``x`` as a 1-element int64 tensor."""
    return op.Shape(x, start=axis, end=axis + 1)


def _steps(n):
    """``0 .. n - 1`` for a 1-element count ``n``."""
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    return op.Range(zero, op.Squeeze(n, [0]), one)


def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """Element ``(i, i + offset)`` of each matrix (dims moved last, the offset sliced off) is at
    ``i * (cols + 1)`` of the matrix flattened, for ``i < min(rows, cols)``: one ``Gather``."""
    rank = len(self.shape)
    perm, _ = _moved_last(rank, dim1, dim2)
    y = op.Transpose(self, perm=perm)
    if offset >= 0:
        y = op.Slice(y, [offset], [_END], [rank - 1])
    else:
        y = op.Slice(y, [-offset], [_END], [rank - 2])
    rows, cols = _size(y, rank - 2), _size(y, rank - 1)
    flat = op.Reshape(y, op.Concat(op.Shape(y, end=rank - 2), op.Mul(rows, cols), axis=0))
    at = op.Mul(_steps(op.Min(rows, cols)), op.Squeeze(op.Add(cols, [1]), [0]))
    return op.Gather(flat, at, axis=rank - 2)


def diagonal_scatter(self, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """``self`` with its diagonal replaced by ``src``: ``Where(col - row == offset, value, self)`` over each
    matrix, the value of row ``i`` (offset >= 0) or column ``j`` (below the main diagonal) taken from ``src``
    padded with zeros to that many rows or columns (the padding is never selected)."""
    rank = len(self.shape)
    perm, back = _moved_last(rank, dim1, dim2)
    y = op.Transpose(self, perm=perm)
    rows, cols = _size(y, rank - 2), _size(y, rank - 1)
    on = op.Equal(op.Sub(op.Unsqueeze(_steps(cols), [0]), op.Unsqueeze(_steps(rows), [1])),
                  op.Constant(value_int=offset))  # [rows, cols]
    along = rows if offset >= 0 else cols
    short = op.Sub(along, _size(src, rank - 2))  # what the diagonal lacks of that many
    pads = op.Concat(op.Constant(value_ints=[0] * (2 * rank - 3)), short, axis=0)
    values = op.CastLike(op.Pad(src, pads), y)
    values = op.Unsqueeze(values, [rank - 1] if offset >= 0 else [rank - 2])
    return op.Transpose(op.Where(on, values, y), perm=back)


def translations() -> dict:
    """The two ATen ops -> their translations, for ``custom_translation_table``."""
    import torch
    return {torch.ops.aten.diagonal.default: diagonal, torch.ops.aten.diagonal_scatter.default: diagonal_scatter}
