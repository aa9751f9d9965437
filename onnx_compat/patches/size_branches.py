"""A pad to a multiple behind a branch on the size, padded by zero where the branch is not taken.

Strided encoders pad the time to a multiple of their stride only when it is not one already, as torchaudio's
HDemucs does (``torchaudio/models/_hdemucs.py:158``)::

    le = x.shape[-1]
    if not le % self.stride == 0:
        x = F.pad(x, (0, self.stride - (le % self.stride)))

Both exporters take the example's side of that ``if``: TorchScript freezes it, and dynamo, under torch.onnx
(which defers an undecided size guard to a runtime assert the ONNX graph leaves out), keeps the pad at every
length; at a length that is a multiple the graph pads by a whole stride, one frame too many (measured on
torch 2.13: ``[4, 4, 18]`` in ONNX, ``[4, 4, 17]`` in eager at T=72, stride 4).

While dynamo exports, a branch on a size that the dim's range does not decide, made by the model's own code on
an ``if`` whose only statement pads the name it assigns (``x = F.pad(x, widths, ...)``, no ``else``), stops the
capture (``SizeBranch``), which runs again with that ``if`` rewritten (``source_rewrites.py``): the pad made at
every size, each width times the condition as 1 or 0 in integer arithmetic of the sizes (``a < b`` is
``min(max(b - a, 0), 1)``; ``torch.sym_ite`` would be the direct form, but its ``ITE`` stops torch's fake
kernels further on: "KeyError: ITE", HDemucs' encoder). Where the condition is false that pads by zero, no pad at
all, so the graph computes both sides of the branch. Other size branches are left as they were.
"""
from __future__ import annotations

import ast
from typing import Dict, Optional

import torch

from onnx_compat.errors import SizeBranch
from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.when import dynamo_exporting

from . import empty_skips, scan_loops, source_rewrites
from ._warning_site import model_frame_outside_torch

NAME = "size_branch_pads"
WIDTHS, INDICATOR = "__onnx_compat_pad_widths__", "__onnx_compat_size_indicator__"


def _padded_name(branch: ast.If) -> Optional[str]:
    """``if c: x = F.pad(x, widths, ...)`` with nothing else: ``x``; else None."""
    if branch.orelse or len(branch.body) != 1:
        return None
    stmt = branch.body[0]
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    call = stmt.value
    func = call.func if isinstance(call, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name != "pad" or len(call.args) < 2 or not isinstance(call.args[0], ast.Name) \
            or call.args[0].id != stmt.targets[0].id:
        return None
    return stmt.targets[0].id


def _less(a, b):
    """1 where ``a < b``, else 0, in integer arithmetic the graph holds (``Min``/``Max`` of sizes, no branch)."""
    return torch.sym_min(torch.sym_max(b - a, 0), 1)


_INDICATORS = {
    "Lt": lambda a, b: _less(a, b), "LtE": lambda a, b: _less(a, b + 1),
    "Gt": lambda a, b: _less(b, a), "GtE": lambda a, b: _less(b, a + 1),
    "NotEq": lambda a, b: torch.sym_min(torch.sym_max(a - b, b - a), 1),
    "Eq": lambda a, b: 1 - torch.sym_min(torch.sym_max(a - b, b - a), 1),
}


def indicator(op: str, a, b=0):
    """``a <op> b`` of sizes as 1 or 0 (``op`` an ``ast.cmpop``'s name; "truth" for ``if a:``)."""
    return _INDICATORS["NotEq" if op == "truth" else op](a, b)


def pad_widths(on, widths):
    """Each width times ``on`` (1 where the branch is taken, 0 where not): no pad where it is not."""
    return tuple(w * on for w in widths)


class _Kept(ast.NodeTransformer):
    """The branch's test as an indicator of sizes: each comparison ``indicator("Eq", a, b)``, ``not c`` as
    ``1 - c``, a size's truth as ``indicator("truth", a)``; Python would make each a bool at the example."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        name = type(node.ops[0]).__name__
        return ast.copy_location(ast.Call(ast.Name(INDICATOR, ast.Load()), [ast.Constant(name), node.left,
                                                                            node.comparators[0]], []), node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Not):
            return node
        return ast.copy_location(ast.BinOp(ast.Constant(1), ast.Sub(), _truth(node.operand)), node)


def _truth(node):
    """An indicator already (a comparison, a ``not``), or a size whose truth is taken."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == INDICATOR \
            or isinstance(node, ast.BinOp):
        return node
    return ast.Call(ast.Name(INDICATOR, ast.Load()), [ast.Constant("truth"), node], [])


def _why_not(branch: ast.If) -> Optional[str]:
    if _padded_name(branch) is None:
        return "its body is not one 'x = F.pad(x, widths)' without an else"
    if any(isinstance(n, ast.BoolOp) for n in ast.walk(branch.test)):
        return "its condition joins conditions with and/or, which Python decides at the example"
    if any(isinstance(n, ast.Call) for n in ast.walk(branch.test)):
        return "its condition calls a function, whose value may not be a size"
    if any(isinstance(n, ast.Compare) and len(n.ops) != 1 or isinstance(n, ast.Compare) and type(n.ops[0]).__name__
           not in _INDICATORS for n in ast.walk(branch.test)):
        return "its condition is not comparisons of sizes (==, !=, <, <=, >, >=), one at a time"
    return None


class _Padded(ast.NodeTransformer):
    def __init__(self, lines):
        self.lines, self.done = set(lines), set()

    def visit_If(self, node):
        self.generic_visit(node)
        asked = source_rewrites.asked_in(node, self.lines)
        if not asked or _why_not(node) is not None:
            return node
        stmt = node.body[0]
        call = stmt.value
        test = _truth(_Kept().visit(node.test))
        call.args[1] = ast.Call(ast.Name(WIDTHS, ast.Load()), [test, call.args[1]], [])
        self.done.update(asked)
        return ast.copy_location(stmt, node)


def _rewrite(definition: ast.FunctionDef, lines: frozenset) -> Dict[int, str]:
    padded = _Padded(lines)
    padded.visit(definition)
    branches = {line: source_rewrites.branch_at(definition, line) for line in lines if line not in padded.done}
    return {line: (_why_not(branch) if branch is not None else None) or "no 'if' on that line"
            for line, branch in branches.items()}


RULE = source_rewrites.Rule("pad behind a size branch", SizeBranch, _rewrite, "padded by zero where not taken",
                            {WIDTHS: pad_widths, INDICATOR: indicator})


def _undecided(value) -> bool:
    """A size condition the dims' ranges do not decide: the branch depends on the size."""
    expr, env = getattr(value.node, "expr", None), getattr(value.node, "shape_env", None)
    return expr is not None and bool(expr.free_symbols) and env is not None \
        and env._maybe_evaluate_static(expr) is None


def _bool(wrapped, instance, args, kwargs):
    if not dynamo_exporting() or not _undecided(instance):
        idle(NAME)
        return wrapped(*args, **kwargs)
    frame = model_frame_outside_torch()
    tree = None if frame is None else scan_loops._function_ast(frame.f_code)
    branch = None if tree is None else source_rewrites.branch_at(tree, frame.f_lineno)
    if frame is not None:
        empty_skips.asked_at(instance, branch, frame)  # a skip of an empty selection (its own patch, this hook)
    if branch is None or _why_not(branch) is not None:
        idle(NAME)
        return wrapped(*args, **kwargs)
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    raise SizeBranch(f"{where}: the model branches on the size {instance.node.expr} here, which the exported graph "
                     f"would take as the example's side at every size; the branch only pads, so it is exported as "
                     f"that pad made at every size, by zero where the branch is not taken", where,
                     frame.f_code.co_name)


register(Patch(
    name=NAME,
    description="if <size condition>: x = F.pad(x, widths) (a pad to a multiple, HDemucs) exports under dynamo as "
                "that pad at every size, by zero where the condition is false, not the example's side",
    targets=("torch:SymBool.__bool__",),
    wrapper=_bool,
    when="export",
    aliases=False,
))
