"""A loop step skipped when a data-dependent selection is empty, run on the empty selection instead.

A mixture-of-experts block routes each token to a few experts and loops over the experts, skipping one that got
no token (mambapy's Jamba, ``mambapy/jamba.py:503``; Mixtral-style blocks of transformers)::

    for expert_idx in range(self.num_experts):
        idx, top_x = torch.where(expert_mask[expert_idx])
        if top_x.shape[0] == 0:
            continue
        current = hidden[top_x] ...
        final.index_add_(0, top_x, expert(current) * weights[top_x, idx, None])

The selection's size is a value of the data (an unbacked size to torch.export), so dynamo stops at the ``if``
("Could not guard on data-dependent expression Eq(u0, 0)"): a graph cannot skip a step by a value. The skip is
only a shortcut when the rest of the step does nothing on an empty selection, as here: gathering no rows,
running the expert on none and adding nothing with ``index_add_``. So when dynamo stops at an ``if`` whose
only statement is ``continue`` and whose test compares a data-dependent size with zero (``n == 0``,
``0 == n``, ``n < 1``, ``n <= 0``, ``not n``), the capture runs again with that ``if`` removed
(``source_rewrites.py``): the graph runs the rest of the step on the selection whatever its size.

What this assumes, the rest of the step being a no-op on an empty selection, is the model's to hold: a step
that reduces over the selection (the mean of no rows is NaN) would differ where the model skips. Verification
compares the graph with the model, which does skip; it sees the difference only at inputs that leave a
selection empty, which small inputs with few tokens and many experts do. No hook of its own: the size
branch hook (``size_branches._bool``) asks ``asked_at`` while this patch is in place.
"""
from __future__ import annotations

import ast
from typing import Dict, Optional

from onnx_compat.errors import EmptySkip
from onnx_compat.patches.patch import Patch, acted, through
from onnx_compat.patches.registry import in_place, register

from . import source_rewrites

NAME = "empty_selection_skips"
_ZERO_TESTS = {"Eq": 0, "LtE": 0, "Lt": 1}  # n <op> constant: n is zero


def _is_zero_test(test: ast.expr) -> bool:
    """``n == 0``, ``0 == n``, ``n < 1``, ``n <= 0`` or ``not n`` (``n`` a size, or a flag that says the selection
    is not empty: ``asked_at`` checks which on the value, since ``not empty`` would skip the opposite)."""
    if _negated_size(test):
        return True
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    op, left, right = type(test.ops[0]).__name__, test.left, test.comparators[0]
    if op in _ZERO_TESTS and isinstance(right, ast.Constant) and right.value == _ZERO_TESTS[op]:
        return True
    return op == "Eq" and isinstance(left, ast.Constant) and left.value == 0


def _negated_size(test: ast.expr) -> bool:
    """``not <name, call, attribute or subscript>``: the truth of what may be a size (``not top_x.numel()``)."""
    return isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) \
        and isinstance(test.operand, (ast.Name, ast.Call, ast.Attribute, ast.Subscript))


def _says_nonempty(value) -> bool:
    """The condition is true exactly when its one size is not zero (``n != 0``, ``n > 0``, ``n >= 1``): what
    ``not n`` asks of a size (``SymInt.__bool__`` is ``n != 0``), or a flag that says the selection is not empty."""
    expr = value.node.expr
    if len(expr.free_symbols) != 1:
        return False
    size = next(iter(expr.free_symbols))
    return all(bool(expr.subs(size, n)) == (n > 0) for n in (0, 1, 2, 7))


def why_not(branch: ast.If) -> Optional[str]:
    """None when ``branch`` is ``if <n is zero>: continue`` and nothing else; else what stops it."""
    if branch.orelse or len(branch.body) != 1 or not isinstance(branch.body[0], ast.Continue):
        return "its body is not a lone 'continue' without an else"
    if not _is_zero_test(branch.test):
        return "its test is not a size compared with zero (n == 0, n < 1, n <= 0, not n)"
    return None


def _unbacked(value) -> bool:
    """The condition holds a size that only the data decides (an unbacked symbol of torch.export)."""
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols
    expr = getattr(value.node, "expr", None)
    return expr is not None and has_free_unbacked_symbols(expr)


def asked_at(value, branch: Optional[ast.If], frame) -> None:
    """Raise ``EmptySkip`` for the ``if`` the model's ``frame`` evaluates, when this patch is in place, the
    condition ``value`` asks whether a data-dependent size is zero and ``branch`` only continues the loop."""
    if not in_place(NAME) or branch is None or why_not(branch) is not None or not _unbacked(value):
        return
    if _negated_size(branch.test) and not _says_nonempty(value):  # not <a flag that says "empty">: not a skip of
        return                                                      # the empty selection
    acted(NAME)
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    raise EmptySkip(f"{where}: the model skips a loop step when a data-dependent selection is empty "
                    f"({value.node.expr}), which a graph cannot decide by a value; the rest of the step runs on the "
                    f"empty selection instead (gathering no rows, adding nothing)", where, frame.f_code.co_name)


def _rewrite(definition: ast.FunctionDef, lines: frozenset) -> Dict[int, str]:
    """The ``if`` at each of ``lines`` removed (a ``pass``); the lines that could not be, with why."""
    removed = source_rewrites.AskedIfs(lines, why_not, lambda node: ast.copy_location(ast.Pass(), node))
    removed.visit(definition)
    return removed.unanswered()


RULE = source_rewrites.Rule("empty selection skip", EmptySkip, _rewrite, "run on the empty selection too",
                            assumes="the loop step skipped on an empty selection runs on it instead, taken as "
                                    "doing nothing there (empty_selection_skips)")

register(Patch(
    name=NAME,
    description="if <data-dependent size> == 0: continue (a mixture-of-experts loop skipping an expert that got no "
                "token) exports under dynamo with the rest of the step run on the empty selection, which adds "
                "nothing, instead of stopping at the data-dependent guard",
    # no target of its own: the size branch hook (size_branches._bool) asks asked_at while this is in place
    targets=(),
    wrapper=through,
    when="dynamo",
    requires=("size_branch_pads",),
))
