"""A branch on a tensor's value inside a scan step, taken as ``torch.where`` of its two sides.

xlstm's sLSTM cell picks its first step's stabiliser with a branch on the state's value
(``xlstm/blocks/slstm/src/vanilla/slstm.py:25``)::

    if torch.all(n == 0.0):
        mnew = iraw
    else:
        mnew = torch.max(iraw, logfplusm)

A scan step is one graph for every step, so it cannot branch on a value: dynamo stops the step's trace at
the ``if`` ("Data-dependent branching"), and the Python loop was refused at that line. When each side only
binds names (``name = expression``, the same names on both sides), the branch is the same as computing both
sides and choosing each name with ``torch.where(cond, a, b)``: what the eager model computes at every step,
whichever side it takes. So when a step's trace stops at such a branch, the function holding it runs, for
the scan's trace only, with that ``if`` written so (its source parsed, the branch replaced, compiled with
its own line numbers: ``source_rewrites.py``, whose ``Rule`` this is), and the scan is traced again; its
original code is back as soon as the scan is captured, and the eager model never runs the rewritten one. The
same rule answers a branch outside loops, at torch.onnx's non-strict capture (``strict_retry.py``).

Only the ``if`` torch named is rewritten, never one whose test is a Python value (which the rewrite would
turn into evaluating both sides), and only when both sides are plain assignments to the same names with
no call of an in-place method (``x.add_(1)``): anything else keeps the refusal, with the reason.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional

import torch

from onnx_compat.errors import DataDependentBranch

from . import source_rewrites

WHERE = "__onnx_compat_where__"
BRANCHES = 8  # value branches taken as torch.where in one trace before it gives up


def where_of(cond, a, b):
    """Each name's value after the branch: ``torch.where`` of a tensor condition, Python's choice of a bool."""
    if not isinstance(cond, torch.Tensor):
        return a if cond else b
    return torch.where(cond.to(torch.bool), a, b)


def why_not(branch: ast.If) -> Optional[str]:
    """None when ``branch`` can be ``torch.where`` of its sides; else what stops it."""
    for stmt in branch.body + branch.orelse:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            return f"'{ast.unparse(stmt)[:60]}' is not an assignment to one name"
        in_place = [c for c in ast.walk(stmt.value) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                    and c.func.attr.endswith("_") and not c.func.attr.endswith("__")]
        if in_place:
            return f"'{ast.unparse(in_place[0])[:60]}' changes a tensor in place"
    return None


class _Side(ast.NodeTransformer):
    """One side's assignments into names of its own (``__oc_<k>_<name>``): a later assignment of the side reads
    the side's earlier value, everything else reads the names as they were before the branch."""

    def __init__(self, prefix: str):
        self.prefix, self.bound = prefix, set()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.bound:
            return ast.copy_location(ast.Name(self.prefix + node.id, ast.Load()), node)
        return node

    def side(self, stmts) -> List[ast.stmt]:
        out = []
        for stmt in stmts:
            value = self.visit(stmt.value)
            name = stmt.targets[0].id
            out.append(ast.copy_location(ast.Assign([ast.Name(self.prefix + name, ast.Store())], value), stmt))
            self.bound.add(name)
        return out

    def value(self, name: str) -> ast.Name:
        """The side's value of ``name``: its own, or the one from before the branch where it binds none."""
        return ast.Name(self.prefix + name if name in self.bound else name, ast.Load())


def selected(branch: ast.If, k: int) -> List[ast.stmt]:
    """``if c: a = x else: a = y`` as ``__oc_c = c; __oc_t_a = x; __oc_f_a = y; a = where(__oc_c, ...)``; a name
    one side does not bind keeps there the value it had before the branch (``if c: a = x`` alone included)."""
    cond, sides = f"__oc_c{k}", (_Side(f"__oc_t{k}_"), _Side(f"__oc_f{k}_"))
    out: List[ast.stmt] = [ast.copy_location(ast.Assign([ast.Name(cond, ast.Store())], branch.test), branch)]
    out += sides[0].side(branch.body) + sides[1].side(branch.orelse)
    for name in sorted(sides[0].bound | sides[1].bound):
        choose = ast.Call(ast.Name(WHERE, ast.Load()), [ast.Name(cond, ast.Load()), sides[0].value(name),
                                                         sides[1].value(name)], [])
        out.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], choose), branch))
    return out


def Select(lines) -> source_rewrites.AskedIfs:  # noqa: N802 - a transformer, named as one
    """Every ``if`` whose test spans one of ``lines`` written as ``selected``; ``refused`` keeps why one could
    not be, ``done`` the lines that were (each as asked: a frame stopped in a test of several lines names one
    of them)."""
    return source_rewrites.AskedIfs(lines, why_not, lambda node: selected(node, node.lineno))


def _rewrite(definition: ast.FunctionDef, lines: frozenset) -> Dict[int, str]:
    """The ``if`` at each of ``lines`` as ``torch.where``; the lines that could not be, with why."""
    select = Select(lines)
    select.visit(definition)
    return select.unanswered()


RULE = source_rewrites.Rule("where", DataDependentBranch, _rewrite, "as torch.where of its sides",
                            {WHERE: where_of})


def chosen_by_where(filename: str, line: int, name: str):
    """While the block runs, the function ``name`` at ``filename:line`` takes that line's ``if`` as
    ``torch.where`` (beside the lines an enclosing block took already); yields None when it does, else why
    not (nothing changed)."""
    return source_rewrites.rewritten((filename, line, name), RULE)
