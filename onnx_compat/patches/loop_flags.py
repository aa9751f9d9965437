"""A lifted loop read as it runs: each ``if`` on a flag nothing in the function rebinds replaced by its side.

speechbrain's statistics pooling appends each step's mean under ``if self.return_mean:`` and stacks the list
under the same flag after the loop. The loop lift plans from the source (which lists collect a step's output,
how they are used after the loop), and a conditional append or stack is none of the forms it knows. A flag is
fixed for the whole call: a name or plain attribute chain (``self.return_mean``, negated or not) holding a Python
bool before the loop, that no statement of the function binds or assigns. Such an ``if`` is its taken side in a
copy of the function's tree, which the lift plans and compiles the step from; eager never sees the copy.
"""
from __future__ import annotations

import ast
import copy
from typing import Dict, Optional, Tuple

_NO_FLAG = object()


def taken(tree: ast.AST, loop: ast.For, local: Dict[str, object]) -> Tuple[ast.AST, ast.For]:
    """A copy of the function ``tree`` with its flags' ``if``s resolved, and ``loop`` as it stands in the copy."""
    stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | \
        {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    resolved = ast.fix_missing_locations(_FlagsTaken(local, stored).visit(copy.deepcopy(tree)))
    same = next(n for n in ast.walk(resolved) if isinstance(n, ast.For) and n.lineno == loop.lineno
                and n.col_offset == loop.col_offset)
    return resolved, same


def flag(test: ast.expr, local: Dict[str, object], stored) -> Optional[bool]:
    """The value of an ``if`` test that is a flag (see above), else None."""
    negated = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        negated, test = not negated, test.operand
    if ast.unparse(test) in stored:  # an attribute the function sets (self.flag = ...)
        return None
    chain = []
    while isinstance(test, ast.Attribute):
        chain.append(test.attr)
        test = test.value
    if not isinstance(test, ast.Name) or test.id in stored or test.id not in local:
        return None
    value = local[test.id]
    for attr in reversed(chain):  # plain attributes only: no property runs
        value = getattr(value, "__dict__", {}).get(attr, _NO_FLAG)
    return None if type(value) is not bool else value != negated


class _FlagsTaken(ast.NodeTransformer):
    def __init__(self, local, stored):
        self.local, self.stored = local, stored

    def visit_If(self, node):
        self.generic_visit(node)
        value = flag(node.test, self.local, self.stored)
        return node if value is None else (node.body if value else node.orelse) or [ast.Pass()]
