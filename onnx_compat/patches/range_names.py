"""A ``range`` of a dynamic size bound to a name, then iterated by a ``for`` of the same block: the range
written in the ``for`` itself, for the capture.

sru's naive CPU path picks its direction first and loops later (``sru/ops.py:206``)::

    time_seq = range(length) if di == 0 else range(length - 1, -1, -1)
    ...                                  # the step's inputs cut from U
    for t in time_seq:

A loop over a dynamic size runs as a scan only where ``range()`` is met on the ``for`` line (``loops.py``):
there the loop is known and its body can be read. Met on the assignment, the loop is not running yet and the
names its body reads are not bound, so the range is refused there (``RangeBoundToName``), and the capture runs
again with the function rewritten (``source_rewrites.py``): the assignment's value moved into the ``for``, where
it is evaluated once, as before, when nothing it reads was bound again in between and the name is read
nowhere else. The moved expression keeps its place in the file, so the ``range()`` met on that line is now the
``for``'s, and the lift reads which call of a conditional expression ran from the frame's instruction.
"""
from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Tuple

from onnx_compat.errors import RangeBoundToName

from . import source_rewrites


def _blocks(tree) -> Iterator[List[ast.stmt]]:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _names(nodes, ctx) -> List[str]:
    return [n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)]


def bound_loop(tree, line: int) -> Tuple[Optional[Tuple[List[ast.stmt], int, int]], str]:
    """``(block, k, j)``: ``block[k]``, the statement at ``line``, binds one name to an expression that
    ``block[j]``, a later ``for`` of the same block, iterates; or None and why not."""
    for block in _blocks(tree):
        k = next((k for k, s in enumerate(block) if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if k is None or not isinstance(block[k], ast.Assign):
            continue
        stmt = block[k]
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            return None, "the range is not bound to one name"
        name = stmt.targets[0].id
        j = next((j for j in range(k + 1, len(block)) if isinstance(block[j], ast.For)
                  and isinstance(block[j].iter, ast.Name) and block[j].iter.id == name), None)
        if j is None:
            return None, f"no later 'for' of the same block iterates '{name}'"
        if _names([tree], ast.Load).count(name) != 1 or _names([tree], ast.Store).count(name) != 1:
            return None, f"'{name}' is bound or read elsewhere in the function"
        rebound = set(_names(block[k + 1:j], ast.Store)) & set(_names([stmt.value], ast.Load))
        if rebound:
            return None, f"'{sorted(rebound)[0]}', which the range reads, is bound again before the loop"
        return (block, k, j), ""
    return None, "range() is not bound to a name by an assignment on that line"


def _rewrite(definition: ast.FunctionDef, lines: frozenset) -> Dict[int, str]:
    refused = {}
    for line in sorted(lines):
        found, why = bound_loop(definition, line)
        if found is None:
            refused[line] = why
            continue
        block, k, j = found
        block[j].iter = block[k].value  # evaluated once, at the loop, where nothing it reads has changed
        block[k] = ast.copy_location(ast.Pass(), block[k])
    return refused


RULE = source_rewrites.Rule("range in its for", RangeBoundToName, _rewrite, "written in its for statement")
