"""``range()`` of dynamic sizes whose steps are the same at every size: run at the example's values, unrefused.

A codec cuts its input into segments, and with no segment length set the stride is the whole length
(EnCodec's ``encode``)::

    segment_length = stride = length          # length = x.shape[-1], dynamic
    for offset in range(0, length, stride):   # one step, offset 0, at every length
        frame = x[:, :, offset: offset + segment_length]

``range()`` makes an int of each argument (``SymInt.__index__``), which ``dynamic_loops`` (``loops.py``)
refuses for a dynamic size: a loop sized by it would be unrolled at the example's count. This one is not
sized by it: its trip count ``ceil((stop - start) / step)`` simplifies to a number (``s / s = 1``) and
every step's value ``start + k * step`` is a number too, so the example's range has exactly the steps of
the range at every size the dims may take. That is proven symbolically (sympy, with the shape
environment's value ranges for the step's sign) before the example's values are handed to ``range()``,
without a guard, so the dim stays dynamic. A loop whose count or steps depend on the size (real
fixed-size chunking of a dynamic length) is not proven and goes on to the scan lift or the refusal.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, List, Optional, Sequence

import torch

if TYPE_CHECKING:  # imported where used: a TorchScript export never loads sympy (test_registry)
    import sympy

from .scan_loops import _function_ast

_MAX_STEPS = 4096  # a proven range longer than this is left to the scan lift or the refusal
# what a range() argument re-read from the source may be made of: names, numbers, attributes, arithmetic,
# ``x.shape[k]`` -- nothing that calls a function (a call could do something twice)
_PLAIN = (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Attribute, ast.Subscript, ast.Load, ast.operator,
          ast.unaryop, ast.Expression)


def example_index(frame, size) -> Optional[int]:
    """The int ``size.__index__()`` may give the ``range()`` being called at ``frame``'s line: the example's
    value, when that range's steps are proven the same at every size; None when they are not (or the call
    is not one ``range(...)`` of plain arguments)."""
    call = _range_call(frame)
    values = None if call is None else _values(call.args, frame)
    if values is None or not any(isinstance(v, torch.SymInt) for v in values):
        return None
    shape_env = next(v.node.shape_env for v in values if isinstance(v, torch.SymInt))
    steps = proven_steps([_expr(v) for v in values], shape_env)
    hints = [_hint(v, shape_env) for v in values]
    if steps is None or None in hints or 0 in hints[2:] or len(range(*hints)) != len(steps) \
            or list(range(*hints)) != steps:  # the example's range is the proven one (a step of 0: the model raises)
        return None
    return _hint(size, shape_env)


def _range_call(frame) -> Optional[ast.Call]:
    """The one ``range(...)`` call (positional arguments) spanning the frame's line; None if none or several."""
    tree = _function_ast(frame.f_code)
    if tree is None:
        return None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "range" and node.lineno <= frame.f_lineno <= (node.end_lineno or node.lineno)]
    if len(calls) != 1 or calls[0].keywords or not 1 <= len(calls[0].args) <= 3:
        return None
    return calls[0]


def _values(args: Sequence[ast.expr], frame) -> Optional[list]:
    """The arguments' values, re-read in the model's frame (they were just computed there, and plain
    expressions give the same values again); None when one is not plain or not an int or size."""
    values = []
    for arg in args:
        if not all(isinstance(node, _PLAIN) for node in ast.walk(arg)):
            return None
        try:
            value = eval(compile(ast.Expression(arg), frame.f_code.co_filename, "eval"),  # noqa: S307 - plain
                         frame.f_globals, dict(frame.f_locals))
        except Exception:  # anything the model's own line would have raised is raised there, not here
            return None
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            return None
        values.append(value)
    return values


def _expr(value) -> sympy.Expr:
    import sympy
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)


def _hint(value, shape_env) -> Optional[int]:
    if not isinstance(value, torch.SymInt):
        return int(value)
    hint = getattr(value.node, "hint", None)  # the example's value; an unbacked size has none
    if hint is None and hasattr(shape_env, "guarding_hint_or_throw"):
        try:
            hint = shape_env.guarding_hint_or_throw(value.node.expr)
        except Exception:  # no example value: not handed to range()
            return None
    return None if hint is None else int(hint)


def proven_steps(exprs: List[sympy.Expr], shape_env) -> Optional[List[int]]:
    import sympy
    """The values of ``range(*exprs)`` when they are the same numbers for every value of the symbols in the
    shape environment's ranges; None when that is not proven."""
    start, stop, step = ([sympy.Integer(0)] + exprs + [sympy.Integer(1)])[:3] if len(exprs) == 1 else \
        (exprs + [sympy.Integer(1)])[:3]
    sign = _sign(step, shape_env)
    if sign is None:
        return None
    count = _constant(sympy.ceiling(sympy.simplify((stop - start) / step)), shape_env)
    if count is None or count > _MAX_STEPS:
        return None
    steps = [sympy.simplify(start + k * step) for k in range(max(0, count))]
    if any(s.free_symbols or not s.is_integer for s in steps):
        return None
    return [int(s) for s in steps]


def _sign(expr: sympy.Expr, shape_env) -> Optional[int]:
    """+1 or -1 when the step's sign is the same over the symbols' ranges. A step of 0 is left out: there
    ``range()`` raises in the model's own Python, so no graph is wrong at that size (a dim's range often
    starts at 0: the size ``s`` as a step is positive wherever the model runs)."""
    bounds = _bounds(expr, shape_env)
    if bounds is None:
        return None
    lower, upper = bounds
    if lower == upper == 0:
        return None
    return 1 if lower >= 0 else -1 if upper <= 0 else None


def _constant(expr: sympy.Expr, shape_env) -> Optional[int]:
    """The integer ``expr`` is at every value of its symbols, or None."""
    if not expr.free_symbols:
        return int(expr) if expr.is_integer else None
    bounds = _bounds(expr, shape_env)
    if bounds is None or not bounds[0].is_finite or bounds[0] != bounds[1]:
        return None
    return int(bounds[0])


def _bounds(expr: sympy.Expr, shape_env):
    """The lowest and highest value of ``expr`` over the symbols' ranges (an unbounded side is +-oo)."""
    if not expr.free_symbols:
        return (expr, expr) if expr.is_number else None
    try:
        ranges = shape_env.bound_sympy(expr)
    except Exception:  # an expression the value-range analysis does not take: not proven
        return None
    return ranges.lower, ranges.upper
