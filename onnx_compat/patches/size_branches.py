"""A branch on a size whose body only pads, masks and names what it needs, run at every size with its effect
scaled to nothing where the branch is not taken.

Strided encoders pad the time to a multiple of their stride only when it is not one already, as torchaudio's
HDemucs does (``torchaudio/models/_hdemucs.py:158``)::

    le = x.shape[-1]
    if not le % self.stride == 0:
        x = F.pad(x, (0, self.stride - (le % self.stride)))

Block attention does the same with more in the body: nystrom-attention names the width and pads its mask too
(``padding = m - (n % m)``, ``x = F.pad(...)``, ``if exists(mask): mask = F.pad(...)``), transformers' Granite
speech encoder masks the padded frames of each last block behind a second ``if remainder > 0:``
(``mask = torch.ones(...)``, ``mask[:remainder, :remainder] = 0``, ``pos_attn[...].masked_fill_(mask, v)``).

Both exporters take the example's side of such an ``if``: TorchScript freezes it, and dynamo, under torch.onnx
(which defers an undecided size guard to a runtime assert the ONNX graph leaves out), keeps the body at every
length; at a length that is a multiple the graph pads by a whole block (measured on torch 2.13: ``[4, 4, 18]``
in ONNX, ``[4, 4, 17]`` in eager at T=72, stride 4) and masks a block eager leaves alone.

While dynamo exports, a branch on a size that the dim's range does not decide, made by the model's own code on
an ``if`` with no ``else`` whose body is only
  - pads of a name into itself (``x = F.pad(x, widths, ...)``),
  - masked fills (``t.masked_fill_(mask, v)``, ``x = x.masked_fill(mask, v)``),
  - names bound nowhere else in the function (``padding = ...``; items set on them, ``mask[:r, :r] = 0``),
  - ``if`` statements (on anything: ``exists(mask)``) of the same,
stops the capture (``SizeBranch``), which runs again with that ``if`` rewritten (``source_rewrites.py``): the
condition is taken once, before the body, as 1 or 0 in integer arithmetic of the sizes (``a < b`` is
``min(max(b - a, 0), 1)``; ``torch.sym_ite`` would be the direct form, but its ``ITE`` stops torch's fake kernels
further on: "KeyError: ITE", HDemucs' encoder), and the body runs at every size with each pad's widths and each
fill's mask times it. Where the condition is false nothing is padded or filled, and the names it binds are
read by nothing else, so the graph computes both sides of the branch. Other size branches are left as they were.

A pad to a multiple written with an early return (simple-hierarchical-transformer's ``pad_seq_to_multiple``:
``if remainder == 0: return t, seq_len``, then ``t = F.pad(t, ...)`` and ``return t, seq_len``) is the same
function as ``if not remainder == 0:`` the pad, then the one ``return``, where both returns are the same
expression: folded so (``_early_return``), it is rewritten as above. Dynamo took the early return at an even
example, and the graph failed to reshape an odd length.
"""
from __future__ import annotations

import ast
import copy
from typing import Dict, List, Optional, Set

import torch

from onnx_compat.errors import SizeBranch
from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.when import dynamo_exporting

from . import empty_skips, scan_loops, source_rewrites
from ._warning_site import model_frame_outside_torch

NAME = "size_branch_pads"
WIDTHS, INDICATOR, MASKED = "__onnx_compat_pad_widths__", "__onnx_compat_size_indicator__", \
    "__onnx_compat_masked_where__"
_FILLS = ("masked_fill", "masked_fill_")


def _called(call) -> Optional[str]:
    func = call.func if isinstance(call, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _pad(stmt) -> Optional[ast.Call]:
    """``x = F.pad(x, widths, ...)``: the call; else None."""
    call = stmt.value if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
        and isinstance(stmt.targets[0], ast.Name) else None
    if _called(call) != "pad" or len(call.args) < 2 or not isinstance(call.args[0], ast.Name) \
            or call.args[0].id != stmt.targets[0].id:
        return None
    return call


def _fill(stmt) -> Optional[ast.Call]:
    """``t.masked_fill_(mask, v)`` or ``x = x.masked_fill(mask, v)``: the call; else None."""
    call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if _called(call) not in _FILLS or not isinstance(call.func, ast.Attribute) \
            or not (call.args or any(k.arg == "mask" for k in call.keywords)):
        return None
    if isinstance(stmt, ast.Expr):
        return call if call.func.attr == "masked_fill_" else None
    receiver = call.func.value
    same = len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and isinstance(receiver, ast.Name) \
        and receiver.id == stmt.targets[0].id
    return call if same else None


def _stored(node) -> Set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _bound_outside(branch: ast.If, definition) -> Set[str]:
    """The names the function binds outside ``branch``: its arguments and every other assignment."""
    if definition is None:
        return set()
    inside = {id(n) for n in ast.walk(branch)}
    names = {n.id for n in ast.walk(definition) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
             and id(n) not in inside}
    args = definition.args
    return names | {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a}


def _base(target) -> Optional[str]:
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def _body_why_not(body: List[ast.stmt], taken: Set[str], fresh: Set[str]) -> Optional[str]:
    """Why a statement of ``body`` is not a pad, a fill, a new name or an ``if`` of them (``fresh`` gets the new
    names); None when every one is."""
    for stmt in body:
        if _pad(stmt) is not None or _fill(stmt) is not None or isinstance(stmt, ast.Pass):
            taken |= _stored(stmt)  # a pad's name was bound before it: it pads itself
            continue
        if isinstance(stmt, ast.If):
            why = _body_why_not(stmt.body, taken, fresh) or _body_why_not(stmt.orelse, taken, fresh)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in stmt.targets):
            names = set().union(*map(_stored, stmt.targets))
            read = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
            bound = names & (taken | read)
            why = None if not bound else f"it assigns {', '.join(sorted(bound))}, which the function binds " \
                                         f"elsewhere too"
            fresh |= names
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _base(stmt.targets[0]) in fresh:
            why = None
        else:
            why = f"line {stmt.lineno} is not a pad, a masked fill, a name bound only there or an if of them"
        if why:
            return why
    return None


def _why_not(branch: ast.If, definition=None) -> Optional[str]:
    if branch.orelse:
        return "it has an else, whose side would be left out"
    why = _body_why_not(branch.body, _bound_outside(branch, definition), set())
    if why:
        return why
    if not any(_pad(s) is not None or _fill(s) is not None for s in ast.walk(branch) if isinstance(s, ast.stmt)):
        return "its body has no pad or masked fill to make nothing where it is not taken"
    if any(isinstance(n, ast.BoolOp) for n in ast.walk(branch.test)):
        return "its condition joins conditions with and/or, which Python decides at the example"
    if any(isinstance(n, ast.Call) for n in ast.walk(branch.test)):
        return "its condition calls a function, whose value may not be a size"
    if any(isinstance(n, ast.Compare) and len(n.ops) != 1 or isinstance(n, ast.Compare) and type(n.ops[0]).__name__
           not in _INDICATORS for n in ast.walk(branch.test)):
        return "its condition is not comparisons of sizes (==, !=, <, <=, >, >=), one at a time"
    return None


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


def pad_widths(on, widths, nonzero=None):
    """Each width times ``on`` (1 where the branch is taken, 0 where not): no pad where it is not. A width that
    is the size whose being nonzero is the whole condition (``nonzero``: ``if r != 0:`` pad by ``r``; an early
    return ``if r == 0:``) is that product already, as ``r * [r != 0] == r``: left in its own form, which keeps
    the Min/Max of the indicator out of every size computed from it (torch's symbolic reasoning over those
    took minutes on a hierarchical transformer's nested pads and views)."""
    return tuple(w if nonzero is not None and _same_size(w, nonzero) else w * on for w in widths)


def _same_size(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return False
    node_a, node_b = getattr(a, "node", None), getattr(b, "node", None)
    return node_a is not None and node_b is not None and getattr(node_a, "expr", None) == getattr(node_b, "expr", 1)


def masked_where(on, mask):
    """``mask`` where the branch is taken, nowhere where not (``on`` 1 or 0, a size the graph computes)."""
    return (mask * on).bool()


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


def _nonzero_operand(test) -> Optional[ast.expr]:
    """``x`` where the test is ``x != 0``, ``not x == 0`` or ``x`` alone (its truth); else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Compare) \
            and len(test.operand.ops) == 1 and isinstance(test.operand.ops[0], ast.Eq):
        test, negated = test.operand, True
    elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotEq):
        negated = True
    else:
        return test if isinstance(test, (ast.Name, ast.Attribute, ast.BinOp)) else None
    zero = test.comparators[0]
    return test.left if negated and isinstance(zero, ast.Constant) and zero.value == 0 else None


def _scaled(body: List[ast.stmt], on: str, nonzero: Optional[str] = None) -> None:
    """Each pad's widths and each fill's mask in ``body`` (nested ``if`` too) times the indicator named ``on``
    (``nonzero``: the name of the size the condition asks to be nonzero, taken at the branch)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            _scaled(stmt.body, on, nonzero)
            _scaled(stmt.orelse, on, nonzero)
        elif _pad(stmt) is not None:
            call = _pad(stmt)
            said = [ast.Name(nonzero, ast.Load())] if nonzero else []
            call.args[1] = ast.Call(ast.Name(WIDTHS, ast.Load()), [ast.Name(on, ast.Load()), call.args[1]] + said, [])
        elif _fill(stmt) is not None:
            call = _fill(stmt)
            place = [k for k in call.keywords if k.arg == "mask"] or None
            mask = place[0].value if place else call.args[0]
            scaled = ast.Call(ast.Name(MASKED, ast.Load()), [ast.Name(on, ast.Load()), mask], [])
            if place:
                place[0].value = scaled
            else:
                call.args[0] = scaled


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and ast.dump(a) == ast.dump(b))


def _blocks(definition):
    """Every statement list of the function (bodies, else branches, handlers' bodies), to be changed in place."""
    for node in ast.walk(definition):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _early_return(branch: ast.If, definition) -> Optional[tuple]:
    """``if c: return E`` followed in its block by statements S and ``return E`` again (lucidrains' pads to a
    multiple, ``if remainder == 0: return t, n``), which is ``if not c:`` S, then ``return E``: that ``if``
    (S's own nodes, at the test's place), its block and the span it stands for; None for any other form."""
    if definition is None or branch.orelse or len(branch.body) != 1 or not isinstance(branch.body[0], ast.Return):
        return None
    for block in _blocks(definition):
        at = next((i for i, stmt in enumerate(block) if stmt is branch), None)
        if at is None:
            continue
        rest = block[at + 1:]
        if len(rest) < 2 or not isinstance(rest[-1], ast.Return) or not _same(rest[-1].value, branch.body[0].value):
            return None
        test = ast.copy_location(ast.UnaryOp(ast.Not(), branch.test), branch.test)
        folded = ast.copy_location(ast.If(test, rest[:-1], []), branch)
        return folded, block, at
    return None


def _asked(branch: ast.If, definition) -> ast.If:
    """The branch as the rule reads it: an early return folded into the ``if`` it stands for."""
    found = _early_return(branch, definition)
    return branch if found is None else found[0]


def _fold_early_returns(definition, lines) -> None:
    """Each early return of ``_early_return`` on one of ``lines`` replaced, in its block, by the ``if`` it
    stands for and the one ``return``: the same function, whose branch the rule can then run at every size."""
    for branch in [n for n in ast.walk(definition) if isinstance(n, ast.If) and source_rewrites.asked_in(n, lines)]:
        found = _early_return(branch, definition)
        if found is not None and _why_not(found[0], definition) is None:
            folded, block, at = found
            block[at:len(block) - 1] = [folded]


def _rewrite(definition: ast.FunctionDef, lines: frozenset) -> Dict[int, str]:
    _fold_early_returns(definition, lines)

    def every_size(branch: ast.If) -> List[ast.stmt]:
        on, nonzero = f"__onnx_compat_taken_{branch.lineno}__", f"__onnx_compat_nonzero_{branch.lineno}__"
        operand = _nonzero_operand(branch.test)
        _scaled(branch.body, on, nonzero if operand is not None else None)
        said = [ast.copy_location(ast.Assign([ast.Name(nonzero, ast.Store())], copy.deepcopy(operand)), branch)] \
            if operand is not None else []
        taken = ast.Assign([ast.Name(on, ast.Store())], _truth(_Kept().visit(branch.test)))
        return said + [ast.copy_location(taken, branch)] + branch.body

    asked = source_rewrites.AskedIfs(lines, lambda branch: _why_not(branch, definition), every_size)
    asked.visit(definition)
    return asked.unanswered()


RULE = source_rewrites.Rule("pad or mask behind a size branch", SizeBranch, _rewrite,
                            "padded and masked by nothing where not taken",
                            {WIDTHS: pad_widths, INDICATOR: indicator, MASKED: masked_where})


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
    if branch is None or _why_not(_asked(branch, _definition(tree)), _definition(tree)) is not None:
        idle(NAME)
        return wrapped(*args, **kwargs)
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    raise SizeBranch(f"{where}: the model branches on the size {instance.node.expr} here, which the exported graph "
                     f"would take as the example's side at every size; the branch only pads or masks, so it is "
                     f"exported as run at every size, padding and masking nothing where it is not taken", where,
                     frame.f_code.co_name)


def _definition(tree):
    """The function definition of a parsed function's source (the module ``_function_ast`` gives, or itself)."""
    if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return tree
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


register(Patch(
    name=NAME,
    description="if <size condition>: x = F.pad(x, widths) / t.masked_fill_(mask, v) (a pad to a multiple and "
                "its mask: HDemucs, block attention) exports under dynamo as that body at every size, padding and "
                "masking nothing where the condition is false, not the example's side",
    targets=("torch:SymBool.__bool__",),
    wrapper=_bool,
    when="export",
    aliases=False,
))
