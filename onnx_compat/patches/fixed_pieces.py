"""A dynamic dim cut into pieces of a fixed size and stacked (issue #47, 8): an audio transformer's patch embedding.

``torch.stack(x.split(16, dim=1), dim=1)`` cuts the frames into patches of 16 and stacks them as a new axis.
``split`` returns a Python tuple whose length is ``ceil(T / 16)``: the TorchScript exporter writes a ``Split``
with the example's pieces (ONNX Runtime at another length: "Invalid value in 'split'"), the dynamo exporter must
make the count a number and specialises the frames (measured on torch 2.13).

While either exporter traces, ``split`` of a tensor by one int size from the model's own code returns the
pieces as ``Pieces``: a sequence that is the split itself once it is iterated, indexed or measured (so any other
use computes what it computed), and that ``torch.stack`` takes whole, as the gather of the ``ceil(T / size)``
pieces of ``min(T, size)`` rows from the runtime size. That is the stack at every length the eager model
accepts (a multiple of the size, or one piece shorter than it; any other length makes the eager stack fail on
pieces of two sizes), so the length rule stays the model's: pad to a multiple in the model (``F.pad(x, (0, 0, 0,
-T % 16))``) or declare it (``Dim("time", multiple=16)``). Under dynamo, pieces of a dynamic dim used any other
way than stacked are refused naming the line and that rule (before: the frames specialised far from it).
"""
from __future__ import annotations

import contextlib
import sys
from typing import List, Optional

import torch

from onnx_compat.patches.patch import Patch, idle
from onnx_compat.patches.registry import register
from onnx_compat.patches.when import dynamo_exporting
from . import memory_chunks
from ._calls import tensor_call
from .size_math import symbolic_size
from .recurrent import _refuse  # remembered: torch.onnx.export retries, then it is raised again

NAME = "fixed_pieces"


def _model_frame():
    """The frame of the model's code that called ``split`` (past this package and torch), or None."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__", "").startswith("onnx_compat.patches")
                                 or frame.f_code is Patch.gate.__code__):
        frame = frame.f_back
    if frame is None or frame.f_globals.get("__name__", "").split(".")[0] in ("torch", "onnx_compat"):
        return None
    return frame


class Pieces:
    """``x.split(size, dim)`` not cut yet: the real tuple on first use, the whole stack as one gather."""

    def __init__(self, x: torch.Tensor, size: int, dim: int, cut, where: str, said: str = "") -> None:
        self.x, self.size, self.dim, self._cut, self.where = x, size, dim, cut, where
        self.said = said or f"x.split({size}, dim={dim})"
        self._pieces: Optional[tuple] = None

    def per_step(self) -> Optional[torch.Tensor]:
        """Pieces of one row each (``x.split(1, d)``, ``x.chunk(T, d)`` of a length ``T``), not cut yet: one tensor
        whose index ``t`` is piece ``t`` (a lifted loop's step reads ``pieces[t]`` from it); else None."""
        if self.size != 1 or self._pieces is not None:
            return None
        dim = self.dim % self.x.dim()
        return self.x.unsqueeze(dim + 1).movedim(dim, 0)

    def _real(self) -> tuple:
        if self._pieces is None:
            length = self.x.shape[self.dim]
            if dynamo_exporting() and symbolic_size(length):
                if memory_chunks.whole_here(self.where):  # a cut that only saves memory: one piece
                    self._pieces = (self.x,)
                    return self._pieces
                _refuse_counted(
                    f"{self.where}: {self.said} of a dynamic dim ({length}) used as a Python tuple (other than "
                    f"indexed by the step of a loop run as a scan): its count ceil(T / {self.size}) is a number only "
                    f"at the example. Stack the pieces "
                    f"(torch.stack(x.split({self.size}, {self.dim}), {self.dim}): exported as one gather) or write "
                    f"x.unflatten({self.dim}, (-1, {self.size})); the length rule (a multiple of {self.size}) goes in "
                    f"the model (pad to it) or in the spec (Dim(..., multiple={self.size}))")
            self._pieces = tuple(self._cut())
        return self._pieces

    def __len__(self) -> int:
        return len(self._real())

    def __getitem__(self, index):
        return self._real()[index]

    def __iter__(self):
        return iter(self._real())

    def __add__(self, other):
        return self._real() + tuple(other)

    def __radd__(self, other):
        return tuple(other) + self._real()

    def stacked(self, dim: int) -> torch.Tensor:
        """``torch.stack(pieces, dim)`` as one gather: ``n = ceil(T / size)`` pieces of ``min(T, size)`` rows."""
        x, size, axis = self.x, self.size, self.dim % self.x.dim()
        length = x.shape[axis]
        if isinstance(length, torch.Tensor) or torch.jit.is_tracing():  # TorchScript: a traced 0-d size
            length = torch.as_tensor(length)
            count = torch.div(length + size - 1, size, rounding_mode="floor")
            rows = torch.clamp(length, max=size)
        else:
            count, rows = (length + size - 1) // size, torch.sym_min(length, size)
        index = torch.arange(count, device=x.device)[:, None] * size + torch.arange(rows, device=x.device)[None, :]
        gathered = x.index_select(axis, index.reshape(-1).clamp(max=length - 1))
        out = gathered.unflatten(axis, (-1, index.shape[1]))  # [..., count, rows, ...]
        return out.movedim(axis, dim % (x.dim() + 1))


class CutPieces(tuple):
    """TorchScript's split as it is (a tuple of the example's pieces), remembering what was cut so that
    ``torch.stack`` of it whole is the gather: any other use is the tuple it always was."""

    def stacked(self, dim: int) -> torch.Tensor:
        return Pieces.stacked(self, dim)


def _split(wrapped, instance, args, kwargs):
    """A dynamic dim under dynamo: the lazy ``Pieces``; under TorchScript (which cannot tell a dynamic dim) the
    split itself as ``CutPieces``; anything else, or a call from torch's own code: the split."""
    bound = tensor_call(instance, args, kwargs, ("tensor", "split_size_or_sections", "dim"), {"dim": 0})
    idle(NAME)  # acting only once stacked whole
    frame = _model_frame()
    if bound is None or frame is None or type(bound["split_size_or_sections"]) is not int \
            or not isinstance(bound["tensor"], torch.Tensor) or not isinstance(bound["dim"], int):
        return wrapped(*args, **kwargs)
    x, size, dim = bound["tensor"], bound["split_size_or_sections"], bound["dim"]
    if dynamo_exporting():
        if not symbolic_size(x.shape[dim]):
            return wrapped(*args, **kwargs)
        return Pieces(x, size, dim, lambda: wrapped(*args, **kwargs), f"{frame.f_code.co_filename}:{frame.f_lineno}")
    cut = CutPieces(wrapped(*args, **kwargs))
    cut.x, cut.size, cut.dim = x, size, dim
    return cut


def _chunk(wrapped, instance, args, kwargs):
    """``x.chunk(T, d)`` with ``T`` the dynamic size of dim ``d`` under dynamo: pieces of one row each, as
    ``x.split(1, d)`` (a recurrence's per-step slices cut before its loop); anything else: the chunk."""
    bound = tensor_call(instance, args, kwargs, ("input", "chunks", "dim"), {"dim": 0})
    frame = _model_frame()
    if bound is None or frame is None or not dynamo_exporting() or not isinstance(bound["input"], torch.Tensor) \
            or not isinstance(bound["dim"], int):
        return wrapped(*args, **kwargs)
    if type(bound["chunks"]) is int:
        return _even_chunks(wrapped, args, kwargs, bound["input"], bound["chunks"], bound["dim"],
                            f"{frame.f_code.co_filename}:{frame.f_lineno}")
    if not symbolic_size(bound["chunks"]):
        return wrapped(*args, **kwargs)
    x, dim = bound["input"], bound["dim"]
    if not symbolic_size(x.shape[dim]) or x.shape[dim].node.expr != bound["chunks"].node.expr:
        return wrapped(*args, **kwargs)
    return Pieces(x, 1, dim, lambda: wrapped(*args, **kwargs), f"{frame.f_code.co_filename}:{frame.f_lineno}",
                  f"x.chunk({bound['chunks']}, dim={dim})")


def _even_chunks(wrapped, args, kwargs, x: torch.Tensor, chunks: int, dim: int, where: str):
    """``x.chunk(n, d)`` of a dynamic dim that is a multiple of ``n`` at every size (a bidirectional layer's
    ``h.chunk(2, dim=0)`` of the ``2 * B`` rows it stacked): ``n`` pieces of ``size // n``. torch's own split
    counts its pieces as ``(size + k - 1) // k`` with ``k = ceil(size / n)``, which the shape solver cannot
    prove is ``n`` ("((3*s77 - 1)//s77) == 2"), and the batch became static (speechbrain's LiGRU, torch 2.13).
    Any other chunk (a size that need not divide, where the count does depend on it) is torch's, its line kept
    for the capture's error (``counted_chunks``)."""
    size = x.shape[dim] if -x.dim() <= dim < x.dim() else None
    if chunks < 1 or not symbolic_size(size):
        return wrapped(*args, **kwargs)
    if not _divides(size, chunks):
        if chunks > 1 and memory_chunks.whole_here(where):  # a cut that only saves memory: one piece
            return (x,)
        if _counted is not None and chunks > 1:
            _counted.append(f"{where}: x.chunk({chunks}, dim={dim}) cuts a dynamic dim into ceil(T / ceil(T / "
                            f"{chunks})) pieces, a count that depends on the length, which dynamo made the example's "
                            f"number where the pieces are looped over or unpacked; compute over the whole tensor, or "
                            f"declare the length a multiple of {chunks} (Dim(..., multiple={chunks})), which cuts it "
                            f"into {chunks} pieces at every size")
        return wrapped(*args, **kwargs)
    step = size // chunks
    return tuple(x.narrow(dim, i * step, step) for i in range(chunks))


# the lines of this capture's chunks whose count depends on a dynamic size; None outside ``counted_chunks``
_counted: Optional[List[str]] = None


@contextlib.contextmanager
def counted_chunks(found: List[str]):
    """Around a dynamo capture: ``found`` gets the line of each ``x.chunk(n, d)`` of a dynamic dim that ``n`` need
    not divide, the likely cause when the capture's graph holds that dim only up to a bound (a comprehension
    over the pieces unrolled at the example's count: reformer-pytorch's chunked feed-forward)."""
    global _counted
    outer, _counted = _counted, found
    try:
        yield found
    finally:
        _counted = outer


def _refuse_counted(message: str):
    """Refused, and counted: the capture's strategy that takes cuts whole (``memory_chunks``) is tried after it."""
    if _counted is not None:
        _counted.append(message)
    _refuse(message)


def _divides(size, chunks: int) -> bool:
    """``size`` is a multiple of ``chunks`` for every value its symbols may take."""
    import sympy
    env = size.node.shape_env
    return env._maybe_evaluate_static(sympy.Eq(sympy.Mod(size.node.expr, chunks), 0)) == sympy.true


def _stack(wrapped, instance, args, kwargs):
    bound = tensor_call(None, args, {k: v for k, v in kwargs.items()}, ("tensors", "dim"), {"dim": 0})
    tensors = bound["tensors"] if bound is not None else None
    whole = isinstance(tensors, CutPieces) or (isinstance(tensors, Pieces) and tensors._pieces is None)
    if not whole or "out" in kwargs:
        idle(NAME)
        if isinstance(tensors, Pieces):
            return wrapped(tuple(tensors), *args[1:], **kwargs)
        return wrapped(*args, **kwargs)
    return tensors.stacked(bound["dim"])


_BY_NAME = {"stack": _stack, "chunk": _chunk}


register(Patch(
    name=NAME,
    description="torch.stack(x.split(n, dim)) of a dynamic dim: the pieces stacked as one gather from the runtime "
                "size (TorchScript wrote the example's Split, dynamo specialised the dim); pieces of one row "
                "(split(1), chunk(T) of a length T) indexed by a loop run as a scan are read from the whole tensor; "
                "chunk(n) of a dynamic dim that is a multiple of n is n narrows, without torch's guard on the count "
                "(any other chunk(n) of a dynamic dim is named when that dim comes out a number); "
                "the pieces used as a tuple of a dynamic dim under dynamo are refused naming the line and the "
                "length rule",
    targets=("torch:split", "torch:Tensor.split", "torch:stack", "torch:chunk", "torch:Tensor.chunk"),
    wrapper=lambda wrapped, instance, args, kwargs: _BY_NAME.get(wrapped.__name__, _split)(
        wrapped, instance, args, kwargs),
    when="export",
))
