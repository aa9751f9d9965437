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
its own line numbers), and the scan is traced again; its original code is back as soon as the scan is
captured, and the eager model never runs the rewritten one.

Only the ``if`` torch named is rewritten, never one whose test is a Python value (which the rewrite would
turn into evaluating both sides), and only when both sides are plain assignments to the same names with
no call of an in-place method (``x.add_(1)``): anything else keeps the refusal, with the reason.
"""
from __future__ import annotations

import ast
import contextlib
import gc
import inspect
import textwrap
import types
from typing import Dict, Iterator, List, Optional, Tuple

import torch

WHERE = "__onnx_compat_where__"


def where_of(cond, a, b):
    """Each name's value after the branch: ``torch.where`` of a tensor condition, Python's choice of a bool."""
    if not isinstance(cond, torch.Tensor):
        return a if cond else b
    return torch.where(cond.to(torch.bool), a, b)


def why_not(branch: ast.If) -> Optional[str]:
    """None when ``branch`` can be ``torch.where`` of its sides; else what stops it."""
    if not branch.orelse:
        return "it has no else, so a name it binds has no value on the other side"
    sides = (branch.body, branch.orelse)
    for side in sides:
        for stmt in side:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                return f"'{ast.unparse(stmt)[:60]}' is not an assignment to one name"
            in_place = [c for c in ast.walk(stmt.value) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                        and c.func.attr.endswith("_") and not c.func.attr.endswith("__")]
            if in_place:
                return f"'{ast.unparse(in_place[0])[:60]}' changes a tensor in place"
    bound = [{s.targets[0].id for s in side} for side in sides]
    if bound[0] != bound[1]:
        return f"its sides bind different names ({', '.join(sorted(bound[0] ^ bound[1]))} on one side only)"
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


def selected(branch: ast.If, k: int) -> List[ast.stmt]:
    """``if c: a = x else: a = y`` as ``__oc_c = c; __oc_t_a = x; __oc_f_a = y; a = where(__oc_c, ...)``."""
    cond = f"__oc_c{k}"
    out: List[ast.stmt] = [ast.copy_location(ast.Assign([ast.Name(cond, ast.Store())], branch.test), branch)]
    out += _Side(f"__oc_t{k}_").side(branch.body) + _Side(f"__oc_f{k}_").side(branch.orelse)
    for name in sorted({s.targets[0].id for s in branch.body}):
        choose = ast.Call(ast.Name(WHERE, ast.Load()), [ast.Name(cond, ast.Load()), ast.Name(f"__oc_t{k}_{name}",
                          ast.Load()), ast.Name(f"__oc_f{k}_{name}", ast.Load())], [])
        out.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], choose), branch))
    return out


class Select(ast.NodeTransformer):
    """Every ``if`` at one of ``lines`` written as ``selected``; ``refused`` keeps why one could not be."""

    def __init__(self, lines):
        self.lines, self.refused, self.done = set(lines), {}, set()

    def visit_If(self, node):
        self.generic_visit(node)
        if node.lineno not in self.lines:
            return node
        why = why_not(node)
        if why is not None:
            self.refused[node.lineno] = why
            return node
        self.done.add(node.lineno)
        return selected(node, node.lineno)


def _functions_at(filename: str, line: int, name: str) -> List[types.FunctionType]:
    """The function objects whose code is ``name`` in ``filename`` around ``line`` (closures made by several
    calls share one code object; every one gets the rewrite)."""
    found = [o for o in gc.get_objects() if type(o) is types.FunctionType and o.__code__.co_name == name
             and o.__code__.co_filename == filename
             and o.__code__.co_firstlineno <= line <= max((ln for _, _, ln in o.__code__.co_lines() if ln), default=0)]
    innermost = max((f.__code__.co_firstlineno for f in found), default=None)
    return [f for f in found if f.__code__.co_firstlineno == innermost]


def _recompiled(fn: types.FunctionType, line: int) -> Tuple[Optional[types.CodeType], str]:
    """``fn``'s code with the ``if`` at ``line`` as ``torch.where``; None and why when it cannot be."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as error:
        return None, f"its source cannot be read ({error})"
    tree = ast.parse(source)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    definition = tree.body[0]
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, "its source is not a function definition"
    definition.decorator_list = []
    select = Select([line])
    select.visit(definition)
    if line not in select.done:
        return None, select.refused.get(line, "no 'if' statement starts on that line")
    ast.fix_missing_locations(tree)
    made: Dict[str, object] = {}
    exec(compile(tree, fn.__code__.co_filename, "exec"), dict(fn.__globals__), made)
    code = made[definition.name].__code__
    if code.co_freevars != fn.__code__.co_freevars:
        return None, "it reads names of an enclosing function"
    return code, ""


@contextlib.contextmanager
def chosen_by_where(filename: str, line: int, name: str) -> Iterator[Optional[str]]:
    """While the block runs, the function ``name`` at ``filename:line`` takes that line's ``if`` as
    ``torch.where``; yields None when it does, else why not (nothing changed)."""
    fns = _functions_at(filename, line, name)
    if not fns:
        yield f"no function {name} of {filename} holding line {line} is loaded"
        return
    code, why = _recompiled(fns[0], line)
    if code is None:
        yield why
        return
    from . import int_calls  # while the int()/len() redirection is on, the new code takes it too
    if int_calls.NAME in fns[0].__globals__:
        code = int_calls._rewritten(code)
    undo = [(fn, fn.__code__, WHERE not in fn.__globals__) for fn in fns]
    try:
        for fn in fns:
            fn.__globals__[WHERE] = where_of
            fn.__code__ = code
        yield None
    finally:
        for fn, old, added in undo:
            fn.__code__ = old
            if added:
                fn.__globals__.pop(WHERE, None)
