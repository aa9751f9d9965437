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
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

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


class Select(ast.NodeTransformer):
    """Every ``if`` whose test spans one of ``lines`` written as ``selected``; ``refused`` keeps why one could
    not be, ``done`` the lines that were (each as asked: a frame stopped in a test of several lines names one
    of them)."""

    def __init__(self, lines):
        self.lines, self.refused, self.done = set(lines), {}, set()

    def visit_If(self, node):
        self.generic_visit(node)
        asked = [line for line in self.lines if node.lineno <= line <= node.test.end_lineno]
        if not asked:
            return node
        why = why_not(node)
        if why is not None:
            self.refused.update(dict.fromkeys(asked, why))
            return node
        self.done.update(asked)
        return selected(node, node.lineno)


def _functions_at(filename: str, line: int, name: str) -> List[types.FunctionType]:
    """The function objects whose code is ``name`` in ``filename`` around ``line`` (closures made by several
    calls share one code object; every one gets the rewrite)."""
    found = [o for o in gc.get_objects() if type(o) is types.FunctionType and o.__code__.co_name == name
             and o.__code__.co_filename == filename
             and o.__code__.co_firstlineno <= line <= max((ln for _, _, ln in o.__code__.co_lines() if ln), default=0)]
    innermost = max((f.__code__.co_firstlineno for f in found), default=None)
    return [f for f in found if f.__code__.co_firstlineno == innermost]


def _recompiled(fn: types.FunctionType, lines: frozenset, line: int) -> Tuple[Optional[types.CodeType], str]:
    """``fn``'s code with the ``if`` at each of ``lines`` as ``torch.where``; None and why ``line`` cannot be."""
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
    select = Select(lines)
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


_taken: Dict[Tuple[str, int, str], frozenset] = {}  # a function's lines now taken as where, by (file, first line, name)


@contextlib.contextmanager
def chosen_by_where(filename: str, line: int, name: str) -> Iterator[Optional[str]]:
    """While the block runs, the function ``name`` at ``filename:line`` takes that line's ``if`` as
    ``torch.where`` (beside the lines an enclosing block took already); yields None when it does, else why
    not (nothing changed)."""
    fns = _functions_at(filename, line, name)
    if not fns:
        yield f"no function {name} of {filename} holding line {line} is loaded"
        return
    key = (filename, fns[0].__code__.co_firstlineno, name)
    before = _taken.get(key, frozenset())
    code, why = _recompiled(fns[0], before | {line}, line)
    if code is None:
        yield why
        return
    undo = [(fn, fn.__code__, WHERE not in fn.__globals__) for fn in fns]
    try:
        _taken[key] = before | {line}
        for fn in fns:
            fn.__globals__[WHERE] = where_of
            fn.__code__ = code
        yield None
    finally:
        _taken[key] = before
        if not before:
            del _taken[key]
        for fn, old, added in undo:
            fn.__code__ = old
            if added:
                fn.__globals__.pop(WHERE, None)


def _branch_in(exc: BaseException):
    """The ``DataDependentBranch`` (``checks.py``) that ``exc`` is or was raised from, else None."""
    from onnx_compat.errors import DataDependentBranch, raised_from
    return raised_from(exc, DataDependentBranch)


def captured(capture: Callable[[], object]) -> Tuple[object, int]:
    """``capture()`` (torch.onnx's non-strict ``torch.export``), again with each branch on a tensor's value it
    stopped at taken as ``torch.where`` of its sides, for as long as the capture runs (the graph it returns
    holds no Python); returns the result and how many branches were so taken. A branch that cannot be has
    the reason added to its error, which is raised as it came."""
    taken: List[Tuple[str, int, str]] = []
    with contextlib.ExitStack() as swaps:
        while True:
            try:
                return capture(), len(taken)
            except Exception as exc:
                branch = _branch_in(exc)
                if branch is None or not branch.function or len(taken) >= BRANCHES:
                    raise
                filename, _, line = branch.where.rpartition(":")
                site = (filename, int(line), branch.function)
                why = "taken as torch.where, it still stopped the trace" if site in taken else \
                    swaps.enter_context(chosen_by_where(*site))
                if why is not None:
                    branch.args = (f"{branch.args[0]} (not as torch.where of its sides: {why})",)
                    raise
                taken.append(site)
