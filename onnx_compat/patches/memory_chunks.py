"""Chunks cut only to save memory (issue #47, 9): a loop over ``x.chunk(n, d)`` or ``x.split(s, d)`` of a dynamic
dim whose result does not depend on the cut.

Long-sequence code cuts time into pieces to bound its memory: reformer-pytorch's ``Chunk`` runs a position-wise
feed-forward as ``torch.cat([ff(c) for c in x.chunk(100, dim=-2)], dim=-2)``, performer-pytorch's causal linear
attention carries its prefix sums across ``chunk(128, dim=-2)``, memory-efficient attention walks queries and keys
in ``split(s, dim=-2)`` blocks with an online softmax. The count of pieces depends on the length: a Python number
the exporters make the example's (dynamo unrolls it, TorchScript writes the example's ``Split``). Where the cut
only saves memory, the model computes the same with one piece, the whole dim, and that loop is one step at every
length.

Whether a cut only saves memory is the model's to show, not ours to guess: the pieces of a site are taken whole
when the model's own eager output at the example is the same with that site cut as it cuts it (into two pieces
or more) and with it whole (``check_whole``; float32 reordering aside); verification then compares the graph
with the unpatched model at new lengths, as always. A cut that matters (a state stepped block by block, as a
block-recurrent transformer steps it) changes the output, and the site stays refused, saying so.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from onnx_compat.errors import UnsupportedPattern
from onnx_compat.patches._warning_site import frame_site, model_frame_outside_torch

# by name: under ``patched()`` torch's own dispatch hands the mode the wrapped function, not the one imported here
_CUTS = ("split", "chunk")
# the largest difference, relative to the output's largest value, that counts as the same (float32 sums reordered
# by the cut: ~1e-6 on the test models; a cut that matters is off by a tenth or more)
SAME = 1e-4

_whole: Optional[List[str]] = None  # the sites taken whole in this capture; None outside ``taking_whole``


def whole_here(where: str) -> bool:
    """Under ``taking_whole``: ``where`` (the model's file:line) is taken whole, and remembered."""
    if _whole is None:
        return False
    if where not in _whole:
        _whole.append(where)
    return True


@contextlib.contextmanager
def taking_whole(found: List[str]) -> Iterator[List[str]]:
    """Around a dynamo capture: pieces of a dynamic dim looped over are one piece, the whole dim; ``found`` gets
    each site so taken (``fixed_pieces`` asks ``whole_here`` where it would refuse or count them)."""
    global _whole
    outer, _whole = _whole, found
    try:
        yield found
    finally:
        _whole = outer


class _Cuts(TorchFunctionMode):
    """In eager: each cut by a number at one of ``sites`` counted (``pieces``), or, ``whole``, one piece."""

    def __init__(self, sites: Sequence[str], whole: bool) -> None:
        super().__init__()
        self.sites, self.whole, self.pieces = set(sites), whole, {}  # type: ignore[var-annotated]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) not in _CUTS or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        where = frame_site(model_frame_outside_torch(1))  # the model's line, as ``fixed_pieces`` names it
        if where not in self.sites:
            return func(*args, **kwargs)
        if self.whole:
            return (args[0],)
        out = func(*args, **kwargs)
        self.pieces[where] = max(self.pieces.get(where, 0), len(out))
        return out


def _run(model: torch.nn.Module, args, mode: _Cuts) -> list:
    with torch.no_grad(), torch.random.fork_rng(), mode:  # the same draws in both runs, the user's kept
        torch.manual_seed(0)
        return [t for t in tree_leaves(model(*args)) if isinstance(t, torch.Tensor)]


def check_whole(model: torch.nn.Module, args, sites: Sequence[str]) -> str:
    """The model's eager output at the example, with ``sites`` cut and whole, is the same: one line that says by how
    much, for the report; else ``UnsupportedPattern`` naming the sites and what the difference was."""
    cut = _Cuts(sites, whole=False)
    reference = _run(model, args, cut)
    try:
        whole = _run(model, args, _Cuts(sites, whole=True))
    except Exception as exc:  # noqa: BLE001 - the model's own refusal (an assert on a piece's size), named
        raise stopped(sites, exc, "the model's eager run stops") from exc
    few = {s: cut.pieces.get(s, 0) for s in sites if cut.pieces.get(s, 0) < 2}
    if few:
        raise UnsupportedPattern(
            f"{', '.join(few)}: the example cuts this dim into {max(few.values())} piece(s), too few to show that "
            f"the loop over them computes the same with one; export with an example long enough for two")
    worst = _difference(reference, whole)
    scale = max((float(r.abs().max()) for r in reference if r.is_floating_point() and r.numel()), default=0.0)
    if worst is None or worst > SAME * max(scale, 1e-6):
        off = "other shapes" if worst is None else f"{worst:.3g} off (its largest value {scale:.3g})"
        raise UnsupportedPattern(
            f"{', '.join(sites)}: the loop over these pieces of a dynamic dim is not a cut that only saves memory: "
            f"the model's output at the example is {off} with them as one piece, so their count, which depends "
            f"on the length, is the model's; pad the length to a multiple of the piece in the model, or declare it "
            f"one (Dim(..., multiple=...))")
    return f"the pieces cut at {', '.join(sites)} taken as one (the eager output at the example {worst:.2g} off)"


def stopped(sites: Sequence[str], exc: BaseException, how: str) -> UnsupportedPattern:
    """The refusal of a model that stops with its pieces at ``sites`` as one (``how``: in the capture, or its eager
    run): the innermost error and the line that raised it (an assert on a piece's size says nothing else)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    said = f"{type(exc).__name__}{': ' + str(exc).splitlines()[0] if str(exc).strip() else ''}"
    return UnsupportedPattern(f"{', '.join(sites)}: with these pieces of a dynamic dim as one, {how} ({said} at "
                              f"{_last_line(exc)}): the cut is the model's, not only memory's")


def _last_line(exc: BaseException) -> str:
    """The file:line where ``exc`` was raised."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"


def _difference(reference: list, other: list) -> Optional[float]:
    """The largest absolute difference between two runs' outputs; None when their shapes or kinds differ."""
    if len(reference) != len(other):
        return None
    worst = 0.0
    for r, o in zip(reference, other):
        if r.shape != o.shape or r.dtype != o.dtype:
            return None
        if r.is_floating_point() or r.is_complex():
            worst = max(worst, float((r - o).abs().max())) if r.numel() else worst
        elif not torch.equal(r, o):
            return None
    return worst

