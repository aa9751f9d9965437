"""What a lifted loop steps through, read off its ``for`` statement's iterable.

A loop over a tensor (``for x_t in x.unbind(1)``) steps through its slices in order; a loop over
``range()`` steps through indices, which the step receives as a 0-d tensor. The forms of ``range`` taken
are the ones whose steps are the same function of the size at every size: ``range(n)``, ``range(c, n)``
with a constant start, and the backward direction of a recurrent layer, ``range(n - 1, -1, -1)`` or
``reversed(range(n))``; anything else is refused with its form. Which ``range`` call of the iterable runs
(``range(n) if forward else range(n - 1, -1, -1)``) is read off the frame's current instruction.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

import torch

from onnx_compat.errors import NotLiftable

_REORDERING = ("reversed", "list", "tuple", "sorted", "enumerate", "zip", "iter", "map", "filter")


def check_unbound(loop: Optional[ast.For], via_iter: bool) -> bool:
    """The loop steps through the unbound tensor itself, in order: ``for x_t in x.unbind(d)`` (or
    ``torch.unbind``), or a tensor iterated as it is (``for row in x``, ``for row in self.f(x)``), possibly
    numbered by ``enumerate()`` without a start (True: the steps come with their index). A Python sequence
    made of it first (``reversed(x.unbind(1))``, ``x.unbind(1)[::-1]``, ``list(x)``) may reorder it."""
    if loop is None:
        raise NotLiftable("its source is not a 'for' statement on that line")
    numbered = enumerated(loop)
    it = loop.iter.args[0] if numbered else loop.iter
    if isinstance(it, ast.Call) and (isinstance(it.func, ast.Attribute) and it.func.attr == "unbind"):
        return numbered
    if via_iter and (isinstance(it, (ast.Name, ast.Attribute)) or isinstance(it, ast.Call) and not (
            isinstance(it.func, ast.Name) and it.func.id in _REORDERING)):
        return numbered
    raise NotLiftable(f"its iterable {ast.unparse(it)} is not the unbound tensor "
                      f"itself (x.unbind(d), or the tensor iterated as it is)")


def enumerated(loop: ast.For) -> bool:
    """``for i, x_t in enumerate(<steps>)``: two names, no start."""
    it, target = loop.iter, loop.target
    return (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate"
            and len(it.args) == 1 and not it.keywords and isinstance(target, ast.Tuple) and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts))


def _called(node, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name \
        and not node.keywords


def _running_call(loop: ast.For, frame) -> ast.Call:
    """The ``range(...)`` call of the loop's iterable that the frame is making: the only one, or the one at the
    frame's current instruction (``range(n) if d == 0 else range(n - 1, -1, -1)``)."""
    calls = [n for n in ast.walk(loop.iter) if _called(n, "range")]
    if len(calls) > 1 and frame is not None:
        positions = list(frame.f_code.co_positions())
        at = positions[frame.f_lasti // 2] if frame.f_lasti // 2 < len(positions) else None
        calls = [c for c in calls if at is not None and (c.lineno, c.end_lineno, c.col_offset, c.end_col_offset)
                 == tuple(at)] or calls
    if len(calls) != 1:
        raise NotLiftable(f"its iterable {ast.unparse(loop.iter)} is not range(size) or range(start, size) with a "
                          f"constant start")
    return calls[0]


def _reversed(loop: ast.For, call: ast.Call) -> bool:
    """``reversed(range(...))``: the call is the argument of ``reversed``; otherwise it must be the iterable,
    or one side of a conditional expression that is."""
    it = loop.iter
    while isinstance(it, ast.IfExp):
        it = it.body if any(n is call for n in ast.walk(it.body)) else it.orelse
    if _called(it, "reversed") and len(it.args) == 1 and it.args[0] is call:
        return True
    if it is not call:
        raise NotLiftable(f"its iterable {ast.unparse(loop.iter)} is not range(size) or range(start, size) with a "
                          f"constant start")
    return False


def _minus_one(node) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
        and type(node.operand.value) is int and node.operand.value == 1


def _counts_down(call: ast.Call) -> bool:
    """``range(n - 1, -1, -1)``: the steps n-1 .. 0, a backward direction."""
    return len(call.args) == 3 and _minus_one(call.args[1]) and _minus_one(call.args[2])


def scanned_range(loop: Optional[ast.For], size, frame=None):
    """The steps of ``for t in range(...)`` as indices (``t`` a 0-d tensor in the step): ``range(size)`` 0..size-1,
    ``range(start, size)`` with a constant start start..size-1 (``GatedSteps``), ``range(size, -1, -1)`` (the
    size being ``n - 1``) and ``reversed(range(size))`` the same indices backwards."""
    if loop is None:
        raise NotLiftable("range() is not taken on a 'for' line, nor bound to a name that a later 'for' of the same "
                          "block iterates (seq = range(n); for t in seq); write range(n) in the for statement")
    call = _running_call(loop, frame)
    if _counts_down(call):
        return torch.arange(size + 1).flip(0)
    backwards = _reversed(loop, call)
    start = call.args[0] if len(call.args) == 2 else None
    if isinstance(start, ast.Constant) and type(start.value) is int and start.value > 0 and not backwards:
        return GatedSteps.of_range(start.value, size)
    if len(call.args) != 1 and not (isinstance(start, ast.Constant) and start.value == 0):
        # chunks or a stride: its steps were not proven the same at every size
        raise NotLiftable(f"its iterable {ast.unparse(loop.iter)} steps through the dim, and its steps were not "
                          f"proven the same at every size (as range(0, n, n) is: one step); chunks of a fixed size "
                          f"over a dynamic length are cut with tensor ops over the whole dim (pad it to a multiple "
                          f"of the chunk, then x.unfold(dim, chunk, stride) or a reshape to [..., count, chunk])")
    steps = torch.arange(size)
    return steps.flip(0) if backwards else steps


def emptied_range(loop: ast.For, frame=None) -> int:
    """What the size given to ``range()`` is replaced with once its loop ran as a scan: the value that leaves
    the range empty, so the Python loop runs no step (0, or the stop of ``range(n - 1, -1, -1)``)."""
    return -1 if _counts_down(_running_call(loop, frame)) else 0


@dataclass
class GatedSteps:
    """The steps of ``range(start, size)`` with a constant ``start > 0``: none where ``size <= start`` (at T=1
    for a forward algorithm's ``range(1, T)``), and ONNX Runtime's ``Scan`` fails on a scan input of length 0
    ("Invalid dim0_offset of 0. Dimension 0 is 0", measured on ORT 1.32). So the scan runs at least one step:
    past the range's end that step reads index ``size - 1``, keeps the carried state as it was (``valid``)
    and its outputs are cut to ``count`` steps. ``indices`` is what each step receives (the rest of a loop
    whose first step ran before the scan holds the steps' own values: ``scan_loops.lift``)."""
    indices: object
    valid: torch.Tensor
    count: object  # an int or a SymInt

    @classmethod
    def of_range(cls, start: int, size) -> "GatedSteps":
        steps = torch.arange(start, torch.sym_max(size, start + 1))
        return cls(steps.clamp(max=size - 1), steps < size, torch.sym_max(size - start, 0))
