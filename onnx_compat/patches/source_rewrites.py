"""A model function run, for one capture, with its source rewritten at the line where the capture stopped.

Some code stops torch.onnx's non-strict capture only for how it is written, not for what it computes: a branch
on a tensor's value whose sides only bind names (the same as ``torch.where`` of both sides:
``value_branches.py``), a ``range`` of a dynamic size bound to a name before the loop that iterates it (the same
as the range written in the ``for``: ``range_names.py``). Each such form is a ``Rule``: the refusal that asks for
it (an error carrying the model's ``file:line`` and function name) and the rewrite of the function's parsed
source at that line. When a capture raises such a refusal, the function's code is swapped for the rewritten
one (every function object of that code: closures made by several calls share it), the capture runs again, and
the original code is back as soon as the capture returns; the eager model never runs the rewritten one. A
rewrite that cannot be made leaves the refusal as it was, with the reason added.

A rewritten function's parsed source stays known by its code object (``tree_of``), so the loop lift reads the
rewritten loop (``scan_loops._function_ast``); lines and columns are those of the file, as the code's positions.
"""
from __future__ import annotations

import ast
import contextlib
import gc
import inspect
import textwrap
import types
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from onnx_compat.errors import raised_from

Site = Tuple[str, int, str]  # the model's file, line and function name


@dataclass(frozen=True, eq=False)  # compared and hashed as the one object each rule is
class Rule:
    """One rewrite: ``error`` is the refusal asking for it (``.where`` "file:line", ``.function``), ``rewrite``
    changes the parsed function at the given lines and returns, for each line it could not rewrite, why not;
    ``names`` go into the function's module globals while the rewritten code runs (its helpers); ``said`` is
    how the refusal names the rewrite ("as torch.where of its sides"); ``assumes``: what the rewritten code
    takes for granted that the original did not (empty for a rewrite that computes the same at every input),
    said in the report beside the graph (``recorded``)."""
    name: str
    error: type
    rewrite: Callable[[ast.FunctionDef, frozenset], Dict[int, str]]
    said: str
    names: Dict[str, object] = field(default_factory=dict)
    assumes: str = ""


_records: List[list] = []  # the rewrites made while each ``recorded()`` block is open


def assume(said: str) -> None:
    """Say, to every open ``recorded()`` block, what the graph now takes for granted ("file:line: what")."""
    for found in _records:
        if said not in found:
            found.append(said)


@contextlib.contextmanager
def recorded() -> Iterator[List[str]]:
    """Around a capture: yields a list that gets, for each rewrite made with an assumption, "file:line: what it
    assumes", so the report says what the graph takes for granted where the model's code differs."""
    found: List[str] = []
    _records.append(found)
    try:
        yield found
    finally:
        _records.remove(found)


def asked_in(node: ast.If, lines) -> List[int]:
    """The ``lines`` within ``node``'s condition (its ``if`` to the test's last line): where a frame stops that
    evaluates it, a test of several lines naming any one of them."""
    last = node.test.end_lineno or node.test.lineno
    return [line for line in lines if node.lineno <= line <= last]


class AskedIfs(ast.NodeTransformer):
    """Every ``if`` whose test spans one of ``lines`` replaced by ``replace(node)`` (a statement or a list of
    them) where ``why_not(node)`` is None; ``unanswered()`` gives the lines that were not, with why."""

    def __init__(self, lines, why_not: Callable[[ast.If], Optional[str]], replace: Callable[[ast.If], object]):
        self.lines, self.why_not, self.replace = set(lines), why_not, replace
        self.refused: Dict[int, str] = {}
        self.done: set = set()

    def visit_If(self, node):
        self.generic_visit(node)
        asked = asked_in(node, self.lines)
        if not asked:
            return node
        why = self.why_not(node)
        if why is not None:
            self.refused.update(dict.fromkeys(asked, why))
            return node
        self.done.update(asked)
        return self.replace(node)

    def unanswered(self) -> Dict[int, str]:
        return {line: self.refused.get(line, "no 'if' statement starts on that line")
                for line in self.lines if line not in self.done}


def branch_at(tree: ast.AST, line: int) -> Optional[ast.If]:
    """The ``if`` whose condition spans ``line`` in ``tree``, or None."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.If) and asked_in(n, (line,))), None)


def parsed_at(lines: List[str], start: int) -> ast.Module:
    """Source lines parsed at the place they have in their file: a method's source is dedented to parse, and its
    lines and columns moved back, so a node's position is its instructions' (``code.co_positions()``)."""
    text = textwrap.dedent("".join(lines))
    removed = len(lines[0]) - len(text.splitlines(True)[0]) if lines else 0
    tree = ast.parse(text)
    ast.increment_lineno(tree, max(start, 1) - 1)
    for node in ast.walk(tree):
        if removed and hasattr(node, "col_offset"):
            node.col_offset += removed
            node.end_col_offset = None if node.end_col_offset is None else node.end_col_offset + removed
    return tree


_trees: Dict[types.CodeType, ast.Module] = {}  # a rewritten code -> its parsed, rewritten source
_taken: Dict[Tuple[str, int, str], frozenset] = {}  # (file, first line, name) -> the (rule, line) now rewritten


def tree_of(code) -> Optional[ast.Module]:
    """The rewritten source of ``code`` while it runs for a capture, else None."""
    return _trees.get(code)


def _functions_at(filename: str, line: int, name: str) -> List[types.FunctionType]:
    """The function objects whose code is ``name`` in ``filename`` around ``line`` (the innermost)."""
    found = [o for o in gc.get_objects() if type(o) is types.FunctionType and o.__code__.co_name == name
             and o.__code__.co_filename == filename
             and o.__code__.co_firstlineno <= line <= max((ln for _, _, ln in o.__code__.co_lines() if ln), default=0)]
    innermost = max((f.__code__.co_firstlineno for f in found), default=None)
    return [f for f in found if f.__code__.co_firstlineno == innermost]


def _recompiled(fn: types.FunctionType, asked: frozenset, site: Tuple[Rule, int]):
    """``fn``'s code with every (rule, line) of ``asked`` rewritten, its tree; or None and why ``site`` cannot be."""
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError) as error:
        return None, None, f"its source cannot be read ({error})"
    tree = parsed_at(lines, start)
    definition = tree.body[0]
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, None, "its source is not a function definition"
    definition.decorator_list = []
    for rule in {r for r, _ in asked}:
        refused = rule.rewrite(definition, frozenset(line for r, line in asked if r is rule))
        if site[0] is rule and site[1] in refused:
            return None, None, refused[site[1]]
    ast.fix_missing_locations(tree)
    made: Dict[str, object] = {}
    exec(compile(tree, fn.__code__.co_filename, "exec"), dict(fn.__globals__), made)
    code = made[definition.name].__code__
    if code.co_freevars != fn.__code__.co_freevars:
        return None, None, "it reads names of an enclosing function"
    return code, tree, ""


@contextlib.contextmanager
def rewritten(site: Site, rule: Rule) -> Iterator[Optional[str]]:
    """While the block runs, the function at ``site`` has ``rule``'s rewrite at that line (beside those an
    enclosing block made already); yields None when it has, else why not (nothing changed)."""
    filename, line, name = site
    fns = _functions_at(filename, line, name)
    if not fns:
        yield f"no function {name} of {filename} holding line {line} is loaded"
        return
    key = (filename, fns[0].__code__.co_firstlineno, name)
    before = _taken.get(key, frozenset())
    code, tree, why = _recompiled(fns[0], before | {(rule, line)}, (rule, line))
    if code is None:
        yield why
        return
    added = [n for n in rule.names if n not in fns[0].__globals__]
    undo = [(fn, fn.__code__) for fn in fns]
    try:
        _taken[key], _trees[code] = before | {(rule, line)}, tree
        for fn in fns:
            fn.__globals__.update(rule.names)
            fn.__code__ = code
        yield None
    finally:
        _trees.pop(code, None)
        _taken[key] = before
        if not before:
            del _taken[key]
        for fn, old in undo:
            fn.__code__ = old
        for n in added:
            fns[0].__globals__.pop(n, None)


def captured(capture: Callable[[], object], rules: Sequence[Rule], limit: int = 8) -> Tuple[object, int]:
    """``capture()`` (torch.onnx's non-strict ``torch.export``), again with each refusal a rule answers rewritten
    at its line, for as long as the capture runs; returns the result and how many rewrites were made. A rewrite
    that cannot be made has the reason added to its refusal, which is raised as it came."""
    taken: List[Tuple[str, Site]] = []
    with contextlib.ExitStack() as swaps:
        while True:
            try:
                return capture(), len(taken)
            except Exception as exc:
                asked = next(((rule, err) for rule in rules for err in (raised_from(exc, rule.error),)
                              if err is not None and getattr(err, "function", "")), None)
                if asked is None or len(taken) >= limit:
                    raise
                rule, err = asked
                filename, _, line = err.where.rpartition(":")
                site = (filename, int(line), err.function)
                why = f"{rule.said}, it still stopped the capture" if (rule.name, site) in taken else \
                    swaps.enter_context(rewritten(site, rule))
                if why is not None:
                    err.args = (f"{err.args[0]} (not {rule.said}: {why})",)
                    raise
                taken.append((rule.name, site))
                if rule.assumes:
                    assume(f"{site[0]}:{site[1]}: {rule.assumes}")
