"""Diagonals of tensors that hold infinities, read and built with graph ops that never multiply by zero.

Structured-prediction models keep masked arcs at ``-inf`` and read the diagonal of the score matrix (torch-struct's
dependency-tree partition: ``mask[mask == 0] = -inf`` over the padded arcs, then ``torch.diagonal(scores, 0,
-2, -1).exp()`` as the root scores). Both exporters write ``diagonal`` as ``EyeLike -> Mul -> ReduceSum``
(measured on torch 2.13): an infinity off the diagonal becomes ``inf * 0 = NaN`` and the reduction carries it
into the diagonal element of its row (TorchScript) or column (dynamo), so every padded item of the batch comes
out NaN (the partition: eager [48.7, 23.4, 6.6, 3.1], ONNX Runtime [48.7, nan, nan, nan]). The same holds for
``torch.linalg.diagonal``, ``torch.diag`` of a matrix and ``torch.trace`` under dynamo; the TorchScript exporter
has no ``aten::diag``, ``aten::trace``, ``aten::linalg_diagonal`` or ``aten::diag_embed`` at all.

``diagonal_gather``: while either exporter traces, a diagonal is read as a ``Gather`` of the flattened matrix
at ``i * (cols + 1)`` (after moving the two dims last and slicing off the offset), so no other element takes
part; ``trace`` is the sum of that. ``diag_embed_where`` (TorchScript only: the dynamo exporter writes it
right, with a ``Where``): the matrix is built with ``Where(row - col == -offset, v, 0)``.

Under the dynamo exporter a diagonal stays the view it is (``torch.diagonal``, ``Tensor.diagonal``,
``torch.linalg.diagonal``) and the graph gets the gather from ONNX translations of ``aten::diagonal`` and
``aten::diagonal_scatter`` (``_diagonal_onnx.py``, added by ``onnx_translations``, which this patch requires
where torch takes a translation table): a write through the view (``x.diagonal(0, -2, -1).fill_(0.0)``,
torch-struct's ``semiring.one_``), which torch.export turns into ``diagonal_scatter``, then exports too
(unpatched it stops in torch.onnx's decomposition: "expected to have an entirely functional graph").

Under TorchScript the diagonal read as a gather is a copy, not a view: writing into it does not reach ``x``,
and the TorchScript exporter gives wrong numbers for such a write unpatched too (torch 2.13), so nothing that
exported right is lost. What the copy must not do is hide the write: torch-struct's linear chain fills its
chart's diagonals in place (``semiring.one_(chart[:, :, :].diagonal(0, 3, 4))``) and its graph came out -1e5
where eager gives 16.6, found only by verification. So each copy made during a capture is kept with its
version counter (``copies_watched``, around the capture), and a copy written into refuses the export at the
line of its ``diagonal`` call, saying how to write it out of place or to export with dynamo. Named dims and
``out=`` are left to torch.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F

from onnx_compat import versions
from onnx_compat.errors import UnsupportedPattern
from onnx_compat.patches._calls import tensor_call
from onnx_compat.patches._diagonal_layout import last_two
from onnx_compat.patches._warning_site import frame_site, model_frame_outside_torch
from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, in_place, register
from onnx_compat.patches.when import dynamo_exporting, torchscript_exporting

GATHER = "diagonal_gather"
WHERE = "diag_embed_where"
# the dynamo exporter takes ONNX translations (torch.onnx.export's custom_translation_table): views stay views
TRANSLATED = versions.HAS_DYNAMO and "custom_translation_table" in versions.EXPORT_PARAMS


def diagonal(x: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> torch.Tensor:
    """``torch.diagonal(x, offset, dim1, dim2)`` as a gather: element ``(i, i + offset)`` of each matrix is at
    ``i * (cols + 1)`` of the matrix flattened once the offset is sliced off, for ``i < min(rows, cols)``."""
    rank = x.dim()
    y = x.permute(last_two(rank, dim1 % rank, dim2 % rank))
    y = y[..., :, offset:] if offset >= 0 else y[..., -offset:, :]
    rows, cols = y.shape[-2], y.shape[-1]
    steps = torch.arange(cols, device=x.device)[:rows]  # min(rows, cols) of them, without comparing sizes
    return y.flatten(-2).index_select(-1, steps * (cols + 1))


# this capture's diagonal copies: (copy, its version counter when made, the model's line); None outside one
_watched: Optional[list] = None


def _watch(copy: torch.Tensor) -> torch.Tensor:
    """``copy``, kept to check: it stands for a view (``torch.diagonal``, ``linalg.diagonal``; ``torch.diag`` of
    a matrix is a copy in eager too)."""
    if _watched is not None:
        _watched.append((copy, copy._version, frame_site(model_frame_outside_torch())))
    return copy


@contextlib.contextmanager
def copies_watched():
    """Around a capture: refuse it when a diagonal this patch gave as a copy was written into (its version
    counter moved, which both exporters' traces keep), since the graph would lack the write; when the
    capture failed too (dynamo's ``copy_to`` of the write), the refusal is the error, raised from it."""
    global _watched
    outer, _watched = _watched, []
    watched = _watched
    try:
        yield
    except Exception as exc:
        _refuse_written(watched, exc)
        raise
    finally:
        _watched = outer
    _refuse_written(watched)


def _refuse_written(watched: list, cause: Optional[BaseException] = None) -> None:
    written = [site for copy, version, site in watched if copy._version != version]
    if written:
        raise UnsupportedPattern(
            f"{written[0]}: writes into a diagonal in place (x.diagonal(...) then fill_, masked_fill_, an "
            f"index assignment, ...); the TorchScript exporter drops a write through a diagonal view, so the "
            f"graph would be wrong. Export with dynamo{'' if TRANSLATED else ' (torch 2.13 or later)'}, or "
            f"write it out of place: x = x.masked_fill(torch.eye(n, dtype=torch.bool), value) for a constant, "
            f"or x = x + torch.diag_embed(new - x.diagonal(...), ...) for values") from cause


def translations() -> dict:
    """The ONNX translations the dynamo exporter needs for the views ``_read`` leaves to torch (none unless
    this patch is in place)."""
    from onnx_compat.patches import _diagonal_onnx
    return _diagonal_onnx.translations() if TRANSLATED and in_place(GATHER) else {}


def diag_embed(v: torch.Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> torch.Tensor:
    """``torch.diag_embed(v, offset, dim1, dim2)`` as a ``Where`` over an index comparison: element ``(i, j)``
    of each matrix is ``v[i]`` (``offset >= 0``) or ``v[j]`` (below the main diagonal) where ``j - i == offset``,
    zero elsewhere; then the two new dims are moved to ``dim1``, ``dim2``."""
    rank = v.dim() + 1
    d1, d2 = dim1 % rank, dim2 % rank
    shift = abs(offset)
    padded = F.pad(v, (0, shift)) if shift else v  # [..., n + |offset|]
    steps = torch.arange(padded.shape[-1], device=v.device)
    on = (steps[None, :] - steps[:, None]) == offset  # [size, size]
    values = padded[..., :, None] if offset >= 0 else padded[..., None, :]
    out = torch.where(on, values, torch.zeros((), dtype=v.dtype, device=v.device))  # [..., size, size]
    others = iter(range(rank - 2))
    return out.permute([rank - 2 if d == d1 else rank - 1 if d == d2 else next(others) for d in range(rank)])


def _dims_fit(rank: int, *dims) -> bool:
    """Integer dims in range and distinct (named dims, or a mistake whose error torch should give, are not)."""
    if not all(type(d) is int for d in dims):
        return False
    if not all(-rank <= d < rank for d in dims):
        return False
    return len({d % rank for d in dims}) == len(dims)


def _passed(name: str, wrapped, args, kwargs):
    """Left to torch: this call does not count as the patch acting."""
    idle(name)
    return wrapped(*args, **kwargs)


def _diagonal(wrapped, instance, args, kwargs):
    """``torch.diagonal(input, offset, dim1, dim2)`` / ``Tensor.diagonal`` (dim1, dim2 default to 0, 1)."""
    b = tensor_call(instance, args, kwargs, ("input", "offset", "dim1", "dim2"), {"offset": 0, "dim1": 0, "dim2": 1})
    return _read(b, wrapped, args, kwargs)


def _linalg_diagonal(wrapped, instance, args, kwargs):
    """``torch.linalg.diagonal(A, *, offset, dim1, dim2)`` (dim1, dim2 default to -2, -1)."""
    b = tensor_call(instance, args, kwargs, ("A", "offset", "dim1", "dim2"), {"offset": 0, "dim1": -2, "dim2": -1})
    if b is not None:
        b["input"] = b.pop("A")
    return _read(b, wrapped, args, kwargs)


def _read(b, wrapped, args, kwargs):
    if b is None or not isinstance(b["input"], torch.Tensor) or type(b["offset"]) is not int \
            or b["input"].dim() < 2 or not _dims_fit(b["input"].dim(), b["dim1"], b["dim2"]):
        return _passed(GATHER, wrapped, args, kwargs)
    if TRANSLATED and dynamo_exporting():
        return wrapped(*args, **kwargs)  # the view; the graph reads it by the translation (translations())
    return _watch(diagonal(b["input"], b["offset"], b["dim1"], b["dim2"]))


def _diag(wrapped, instance, args, kwargs):
    """``torch.diag(input, diagonal)``: a matrix's diagonal (both exporters), or a vector's matrix
    (TorchScript, which has no ``aten::diag``; dynamo writes that one right)."""
    b = tensor_call(instance, args, kwargs, ("input", "diagonal"), {"diagonal": 0})
    if b is None or not isinstance(b["input"], torch.Tensor) or type(b["diagonal"]) is not int:
        return _passed(GATHER, wrapped, args, kwargs)
    x, offset = b["input"], b["diagonal"]
    if x.dim() == 2:
        return diagonal(x, offset, 0, 1)
    if x.dim() == 1 and torchscript_exporting():
        return diag_embed(x, offset, 0, 1)
    return _passed(GATHER, wrapped, args, kwargs)


def _trace(wrapped, instance, args, kwargs):
    """``torch.trace`` of a matrix: the sum of its diagonal (ints sum to int64, as torch's trace does)."""
    b = tensor_call(instance, args, kwargs, ("input",))
    if b is None or not isinstance(b["input"], torch.Tensor) or b["input"].dim() != 2:
        return _passed(GATHER, wrapped, args, kwargs)
    return diagonal(b["input"]).sum()


def _gather(wrapped, instance, args, kwargs):
    """One patch for every way of reading a diagonal, dispatched by the function wrapped."""
    reader = {"diagonal": _diagonal, "linalg_diagonal": _linalg_diagonal, "diag": _diag, "trace": _trace}
    return reader[wrapped.__name__](wrapped, instance, args, kwargs)


def _embed(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "offset", "dim1", "dim2"),
                    {"offset": 0, "dim1": -2, "dim2": -1})
    if b is None or not isinstance(b["input"], torch.Tensor) or type(b["offset"]) is not int \
            or b["input"].dim() == 0 or not _dims_fit(b["input"].dim() + 1, b["dim1"], b["dim2"]):
        return _passed(WHERE, wrapped, args, kwargs)
    return diag_embed(b["input"], b["offset"], b["dim1"], b["dim2"])


register(Patch(
    name=GATHER,
    description="diagonals of tensors holding infinities (masked -inf arc scores: torch-struct's dependency "
                "CRF) export without NaN under both exporters (a Gather, not EyeLike*Mul): torch.diagonal, "
                "Tensor.diagonal, torch.linalg.diagonal, torch.diag, torch.trace; diag, trace and "
                "linalg.diagonal also export under TorchScript; under dynamo a write through a diagonal view "
                "(x.diagonal().fill_(v)) exports (a Where), under TorchScript it is refused at its line",
    targets=("torch:diagonal", "torch:Tensor.diagonal", "torch:linalg.diagonal", "torch:diag", "torch:Tensor.diag",
             "torch:trace", "torch:Tensor.trace"),
    wrapper=_gather,
    when="export",
    requires=("onnx_translations",) if TRANSLATED else (),  # the translations serve its dynamo path
))
register(Patch(
    name=WHERE,
    description="torch.diag_embed / Tensor.diag_embed export under TorchScript (a Where over an index "
                "comparison, so infinities stay where they are)",
    targets=("torch:diag_embed", "torch:Tensor.diag_embed"),
    wrapper=_embed,
    when="torchscript",
))
