"""What a Python loop's source says before anything runs: the plan of its scan and the checks that refuse it.

``scan_loops.py`` lifts a loop over a dynamic dim into a ``torch`` scan; this module reads the loop's ``ast``
(the function's source, or its rewritten source, at the file's lines) and decides what the step carries (names
stored in the body that exist before it), which lists collect its outputs (``L.append(e)``), which stores are
step outputs (``buf[:, t] = v``), and refuses, with ``NotLiftable`` naming the reason, what a scan step cannot
be: ``break``/``return``, a store by rows, a list read otherwise than stacked, a carried value that is not a
tensor, an in-place update of a state something else sees, a step's temporary read after the loop.
"""
from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..errors import NotLiftable
from . import source_rewrites
from .scan_steps import enumerated

_FORBIDDEN = (ast.Break, ast.Continue, ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal,
              ast.Delete, ast.Await)


@dataclass
class _Plan:
    loop: ast.For
    carries: List[str] = field(default_factory=list)
    lists: List[str] = field(default_factory=list)
    stores: List[ast.Assign] = field(default_factory=list)  # buf[..., t, ...] = v at the body's top level
    aliases: Dict[str, str] = field(default_factory=dict)  # a temporary read after the loop -> the carry it equals
    index: Optional[str] = None  # the step's index: range()'s variable, or enumerate()'s first one


def _targets(loop: ast.For) -> List[str]:
    """The loop's variables: ``t``, or ``i, x_t`` of ``enumerate(...)``."""
    return [n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)]


def _function_ast(code) -> Optional[ast.AST]:
    """The function's source parsed, its line numbers and columns those of the file (as the code's positions);
    for a function rewritten for the capture (``source_rewrites.py``), its rewritten source."""
    return source_rewrites.tree_of(code) or _file_ast(code)


@functools.lru_cache(maxsize=64)
def _file_ast(code) -> Optional[ast.AST]:
    try:
        lines, start = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return None
    return source_rewrites.parsed_at(lines, start)


def loop_at(frame) -> Optional[ast.For]:
    """The innermost ``for`` statement whose iterable is on the frame's current line."""
    tree = _function_ast(frame.f_code)
    if tree is None:
        return None
    found = [node for node in ast.walk(tree) if isinstance(node, ast.For)
             and node.iter.lineno <= frame.f_lineno <= (node.iter.end_lineno or node.iter.lineno)]
    return max(found, key=lambda n: n.lineno, default=None)


def _check_body(loop: ast.For, index: Optional[str], local: Dict[str, object]) -> List[ast.Assign]:
    """The body's forbidden statements and stores; the stores at the step's index it keeps (``_step_store``)."""
    if loop.orelse:
        raise NotLiftable("it has an else: clause")
    if not isinstance(loop.target, ast.Name) and not enumerated(loop):
        raise NotLiftable("its loop variable is not a single name (nor 'i, x' of enumerate() without a start)")
    stores = [stmt for stmt in loop.body if _step_store(stmt, loop, index, local) is not None]
    kept = {id(stmt.targets[0]) for stmt in stores}
    for node in (n for stmt in loop.body for n in ast.walk(stmt)):
        if isinstance(node, _FORBIDDEN):
            raise NotLiftable(f"its body has a '{type(node).__name__.lower()}' statement")
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store) \
                and id(node) not in kept and not _module_attribute(node, local):
            raise NotLiftable(f"its body stores into {ast.unparse(node)} (line {node.lineno}), which a scan "
                              f"step cannot carry; a store by rows is a mask or a where() over the whole dim "
                              f"(a store at the step's index into a tensor made before the loop, buf[:, t] = v "
                              f"with buf not read in the loop, is run as a step output)")
    return stores


def _module_attribute(node, local: Dict[str, object]) -> bool:
    """``self.h = ...``, a module's attribute: the step's writes to modules are carried (``module_state.py``)."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
        and isinstance(local.get(node.value.id), torch.nn.Module)


def _step_store(stmt, loop: ast.For, index: Optional[str], local: Dict[str, object]) -> Optional[int]:
    """``buf[..., t + k, ...] = v`` at the body's top level, ``buf`` a tensor made before the loop and not
    read in the body, the parts before ``t`` slices or int constants and the others not set in the loop:
    each step writes one slot, so the stacked values written once after the scan are the same stores. The
    position of ``t`` among the subscript's parts, or None."""
    if index is None or not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                             and isinstance(stmt.targets[0], ast.Subscript)):
        return None
    target = stmt.targets[0]
    if not isinstance(target.value, ast.Name) or not isinstance(local.get(target.value.id), torch.Tensor):
        return None
    parts = list(target.slice.elts) if isinstance(target.slice, ast.Tuple) else [target.slice]
    at = next((k for k, p in enumerate(parts) if _step_offset(p, index) is not None), None)
    if at is None or not all(isinstance(p, ast.Slice) and p.lower is p.upper is p.step is None
                             or isinstance(p, ast.Constant) and type(p.value) is int for p in parts[:at]):
        return None
    set_in_loop = {n.id for n in _names(loop.body, ast.Store)} | set(_targets(loop))
    others = [n.id for p in parts[:at] + parts[at + 1:] for n in _names([p], ast.Load)]
    read = [n.id for n in _names(loop.body, ast.Load)].count(target.value.id)
    if set_in_loop & set(others) or read != 1 or _step_offset(parts[at], index) < 0:
        return None
    return at


def _appended(stmt) -> Optional[str]:
    """``L.append(e)`` as a statement: the list's name."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "append" \
            and isinstance(call.func.value, ast.Name) and len(call.args) == 1 and not call.keywords:
        return call.func.value.id
    return None


def _names(nodes, ctx) -> List[ast.Name]:
    return [n for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)]


def _plan(tree, loop: ast.For, local: Dict[str, object], by_index: bool) -> _Plan:
    """Which names the loop carries and which lists collect its steps; NotLiftable when neither is sound."""
    index = (loop.target.elts[0].id if enumerated(loop) else
             loop.target.id if by_index and isinstance(loop.target, ast.Name) else None)
    plan = _Plan(loop, index=index)
    plan.stores = _check_body(loop, index, local)
    plan.lists = [name for name in map(_appended, loop.body) if name is not None]
    for name in plan.lists:
        if plan.lists.count(name) > 1 or local.get(name) != [] or not isinstance(local.get(name), list):
            raise NotLiftable(f"'{name}' is appended to more than once a step, or was not an empty list before")
    loads_in_body = [n.id for n in _names(loop.body, ast.Load)]
    for name in plan.lists:
        if loads_in_body.count(name) != 1:
            raise NotLiftable(f"its body reads the list '{name}' it appends to")
    stored = {n.id for n in _names(loop.body, ast.Store)} - set(_targets(loop))
    plan.carries = sorted(name for name in stored if name in local)
    for name in plan.carries:
        if not isinstance(local[name], torch.Tensor):
            raise NotLiftable(f"it carries '{name}', which is a {type(local[name]).__name__} before the loop, "
                              f"not a tensor")
    _check_in_place(loop, plan, local)
    plan.aliases = _last_values(loop, plan.carries, stored)
    _check_after(tree, loop, plan, stored - set(plan.carries) - set(plan.aliases))
    return plan


def _last_values(loop: ast.For, carries: List[str], stored) -> Dict[str, str]:
    """``h = h_t`` at the body's top level, ``h`` carried and ``h_t`` bound in the body, neither bound again after
    it: after the loop ``h_t`` holds the last step's value, which is ``h``'s final state (a cell's code reading
    its last ``c_t`` after the loop). Such temporaries -> their carry."""
    found = {}
    for stmt in loop.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Name)):
            continue
        carry, temp = stmt.targets[0].id, stmt.value.id
        later = {n.id for n in _names(loop.body, ast.Store) if n.lineno > (stmt.end_lineno or stmt.lineno)}
        if carry in carries and temp in stored and temp not in carries and not {carry, temp} & later:
            found[temp] = carry
    return found


def _check_in_place(loop: ast.For, plan: _Plan, local: Dict[str, object]) -> None:
    """``h += e`` on a carried name updates the state in place: run as ``h = h + e`` in the step, which is the
    same only if nothing else sees that tensor (another name bound to it, a parameter, a view of another)."""
    augmented = {n.target.id for stmt in loop.body for n in ast.walk(stmt)
                 if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)} & set(plan.carries)
    for name in sorted(augmented):
        value = local[name]
        shared = [other for other, v in local.items() if other != name and v is value]
        if shared or isinstance(value, torch.nn.Parameter) or value._is_view():
            seen = f"'{shared[0]}' is the same tensor" if shared else "it is a parameter or a view of another"
            raise NotLiftable(f"it updates '{name}' in place ({name} op= ...) and {seen}, which would see each "
                              f"step's update")


def _check_after(tree, loop: ast.For, plan: _Plan, temporaries) -> None:
    """Outside the loop a step's temporary is never read, and a step list only as ``torch.stack/cat(L, ...)``."""
    inside = {id(n) for n in ast.walk(loop)}
    stacked = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
               and isinstance(call.func, ast.Attribute) and call.func.attr in ("stack", "cat", "concat", "concatenate")
               and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"}
    rebound = _rebound_by_other_loops(tree, loop)
    stacked_as = _stacked_into_itself(tree, loop, plan.lists, stacked)
    for name in _names([tree], ast.Load):
        if id(name) in inside or id(name) in rebound or name.lineno > stacked_as.get(name.id, name.lineno):
            continue
        if name.id in temporaries or name.id in _targets(loop):
            raise NotLiftable(f"'{name.id}', set in the loop, is read after it (line {name.lineno})")
        if name.id in plan.lists and id(name) not in stacked and name.lineno > loop.lineno:
            raise NotLiftable(f"the list '{name.id}' is used at line {name.lineno} other than as "
                              f"torch.stack/torch.cat(...){_walked_in_python(tree, loop)}")


_BLOCKS = ("body", "orelse", "finalbody")  # the statement lists a loop can stand in (an else: too)


def _stacked_into_itself(tree, loop: ast.For, lists, stacked) -> Dict[str, int]:
    """``hs = torch.stack(hs, dim=1)`` as a statement after the loop, beside it: from its last line on the name
    is the stacked tensor, and its reads are that tensor's. The list name -> that line."""
    beside = next((body for node in ast.walk(tree) for body in (getattr(node, field, None) for field in _BLOCKS)
                   if isinstance(body, list) and any(stmt is loop for stmt in body)), [])
    found: Dict[str, int] = {}
    for stmt in beside[beside.index(loop) + 1:] if beside else ():
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id in lists and stmt.targets[0].id not in found:
            reads = [n for n in _names([stmt.value], ast.Load) if n.id == stmt.targets[0].id]
            if reads and all(id(n) in stacked for n in reads):
                found[stmt.targets[0].id] = stmt.end_lineno or stmt.lineno
    return found


def _rebound_by_other_loops(tree, loop: ast.For) -> set:
    """Reads of a name inside the body of another ``for`` that binds it (``for i in ...`` again, a common reuse
    of a loop variable): they read that loop's value, not this one's. A ``for`` around this loop is not
    another: after this loop, its body reads what this loop left."""
    rebound = set()
    for other in ast.walk(tree):
        if not isinstance(other, ast.For) or any(n is loop for n in ast.walk(other)):
            continue
        bound = {n.id for n in ast.walk(other.target) if isinstance(n, ast.Name)}
        rebound |= {id(n) for stmt in other.body + other.orelse for n in ast.walk(stmt)
                    if isinstance(n, ast.Name) and n.id in bound}
    return rebound


_VALUE_READS = ("item", "tolist", "numpy")


def _walked_in_python(tree, loop: ast.For) -> str:
    """A step list used in Python after the loop, where the function also reads tensor values into Python
    (``.item()``, ``.tolist()``, ``.numpy()``): a walk over the steps driven by values (a Viterbi backtrace into
    Python lists). Said with those lines and the tensor form that would export; "" when there are none."""
    reads = sorted({(n.lineno, n.func.attr) for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute) and n.func.attr in _VALUE_READS and not n.args
                    and n.lineno > (loop.end_lineno or loop.lineno)})
    if not reads:
        return ""
    said = ", ".join(f".{attr}() at line {line}" for line, attr in reads)
    return (f"; after the loop the function reads tensor values into Python ({said}), so what it builds from the "
            f"steps (a backtrace into Python lists) follows the input's values, which no exported graph can. To "
            f"export, keep the steps as one tensor (torch.stack) and walk them back with tensor ops (torch.gather "
            f"of each step's indices at the current one, a loop carrying it over the reversed steps), returning "
            f"padded tensors; or keep that part outside the exported model")


def _step_offset(part, index: str) -> Optional[int]:
    """``t`` -> 0, ``t - 1`` -> -1, ``t + 2`` / ``2 + t`` -> 2: a subscript part that is the step's index
    shifted by an int constant; None for anything else."""
    if isinstance(part, ast.Name) and part.id == index:
        return 0
    if isinstance(part, ast.BinOp) and isinstance(part.op, (ast.Add, ast.Sub)):
        left, right = part.left, part.right
        const = (lambda n: isinstance(n, ast.Constant) and type(n.value) is int)
        if _step_offset(left, index) is not None and const(right):
            return _step_offset(left, index) + (right.value if isinstance(part.op, ast.Add) else -right.value)
        if isinstance(part.op, ast.Add) and const(left) and _step_offset(right, index) is not None:
            return left.value + _step_offset(right, index)
    return None
