"""A Python loop over a dynamic dim that carries state, run as one ``torch`` scan while dynamo traces.

Custom recurrent cells and sequential scans are written as Python loops over time::

    h = x.new_zeros(B, H); outs = []
    for x_t in x.unbind(1):          # or: for t in range(x.size(1)): ... x[:, t] ...
        h = self.cell(x_t, h)
        outs.append(h)
    y = torch.stack(outs, 1)

Neither exporter writes a Python loop as a graph loop: TorchScript unrolls it at the example's length,
dynamo specialises the dim. torch 2.13 does export ``torch._higher_order_ops.scan`` as an ONNX ``Scan``
(measured: an RNN cell's scan verifies at lengths 1, 37 and 148). So when ``dynamic_loops`` meets such a
loop (``loops.py``), the loop's source is read (``ast``) and, if its body is a step (assignments whose
names are the carried state, ``list.append`` of per-step outputs), the body is compiled as a step
function and run through ``scan`` over the dim; the carried names are written back into the model's
frame, and each output list receives one ``StackedSteps`` standing for all its steps, which
``torch.stack`` / ``torch.cat`` of the list turn into the scan's stacked output. The loop itself then
runs zero times. What the loop steps through (a tensor's slices, ``range`` forwards or backwards) is
``scan_steps.py``'s; a store at the step's index (``h[t] = v``) is a step output stored once after the scan;
a state whose shape the first step changes has that step run before the scan; a temporary the body ends by
carrying (``c = c_t``) is read after the loop as the final state.

What is not lifted is refused by ``loops.py`` naming the line and the reason (a subscript store such as a
mask zeroed row by row, ``break``, a list read otherwise than stacked, a carried value that is not a
tensor, a body the scan cannot trace: ``scan_traces.py``). State a step keeps on modules (``self.mem = ...``)
is carried by the scan as one more part of its state (``module_state.py``); a Python value it changes there is
refused. The checks are on the source, before anything runs (``scan_plans.py``), so a loop that is lifted
computes exactly what its Python loop computes, step by step.
"""
from __future__ import annotations

import ast
import copy
import ctypes
import sys
from typing import Dict, List, Optional

from ..errors import NotLiftable  # in the one family; importable from here as before

import torch

from onnx_compat.errors import UnsupportedPattern

from . import fixed_pieces, loop_flags, scan_traces, value_branches
# the source's plan and checks (scan_plans.py); loop_at and _function_ast are read from here by loops.py and others
from .scan_plans import _Plan, _appended, _function_ast, _names, _plan, _step_offset, _targets, loop_at  # noqa: F401
from .scan_steps import GatedSteps, check_unbound, emptied_range, enumerated, scanned_range  # noqa: F401 (this module's names before)


class _TakeStep(ast.NodeTransformer):
    """``x[:, t]``, ``x[t - 1]``, ``x[t, rows, cols]`` with ``t`` the step's index (a 0-d tensor in a scan):
    ``index_select`` of dim ``k`` at ``t`` (a gather), then the subscript's other parts on what is left. Torch
    selects an int index before any advanced index, so that is exactly ``x[..., t, ...]`` whenever the parts
    before ``t`` each take one dim (slices, int constants). A subscript by a tensor would read ``t`` as a Python
    number."""

    def __init__(self, index: str):
        self.index = index

    def visit_Subscript(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        parts = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        at = next((k for k, p in enumerate(parts) if _step_offset(p, self.index) is not None), None)
        if at is None or not all(isinstance(p, ast.Slice) or isinstance(p, ast.Constant) and type(p.value) is int
                                 for p in parts[:at]):
            return node
        offset = _step_offset(parts[at], self.index)
        call = ast.Call(ast.Name("__oc_take", ast.Load()), [node.value, ast.Constant(at), parts[at],
                                                             ast.Constant(offset != 0)], [])
        rest = parts[:at] + parts[at + 1:]
        if rest:  # the other parts index what the take left: visited again for a second step index
            rest_slice = ast.Tuple(rest, ast.Load()) if len(rest) > 1 else rest[0]
            return self.visit_Subscript(ast.copy_location(ast.Subscript(call, rest_slice, ast.Load()), node))
        return ast.copy_location(call, node)


def _take(x, dim: int, index, shifted: bool = False):
    """``x[t]`` along ``dim``; a shifted index (``t - 1``) may be negative, which Python reads from the end
    (as Python does); the clamp only keeps a dropped step past a range's end (``GatedSteps``) inside the dim."""
    if shifted:
        index = torch.where(index < 0, index + x.shape[dim], index).clamp(0, x.shape[dim] - 1)
    return x.index_select(dim, index.reshape(1)).squeeze(dim)


class _AugmentedCarry(ast.NodeTransformer):
    """``h += e`` on a carried name: in eager an in-place update of the state, which a scan step may not make on
    its carry; ``h = __oc_same(h, h + e)`` is the same value (the result keeps ``h``'s dtype, as in place)."""

    def __init__(self, carries):
        self.carries = set(carries)

    def visit_AugAssign(self, node):
        if not (isinstance(node.target, ast.Name) and node.target.id in self.carries):
            return node
        name = node.target.id
        value = ast.BinOp(ast.Name(name, ast.Load()), node.op, node.value)
        call = ast.Call(ast.Name("__oc_same", ast.Load()), [ast.Name(name, ast.Load()), value], [])
        return ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], call), node)


def _same(before: torch.Tensor, after):
    return after.to(before.dtype) if isinstance(after, torch.Tensor) else after


def _fit(slot: torch.Tensor, value):
    """What ``buf[..., t, ...] = value`` writes: ``value`` broadcast to the slot, in the buffer's dtype (leading
    dims of size 1 dropped, as an assignment does): the step's output, stacked and stored after the scan."""
    value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    extra = value.dim() - slot.dim()
    if extra > 0:
        value = value.reshape(value.shape[extra:])
    return value.to(slot.dtype).expand(slot.shape)


def _step_source(loop: ast.For, plan: _Plan, free: List[str]) -> ast.FunctionDef:
    """``make(free...) -> step(carry, x_t) -> (carry, outputs)``: the model's locals the body reads are the
    step's closure (as globals, dynamo's guards would look them up in the model's module)."""
    body, stored_at = [], [ast.unparse(stmt) for stmt in plan.stores]
    for stmt in copy.deepcopy(loop.body):  # the parsed source is cached: the step's rewrites stay on a copy
        name = _appended(stmt)
        if name is not None:
            stmt = ast.copy_location(ast.Assign([ast.Name(f"__oc_y_{plan.lists.index(name)}", ast.Store())],
                                                 stmt.value.args[0]), stmt)
        elif ast.unparse(stmt) in stored_at:  # a store at the step's index: the step's output, written after
            k = len(plan.lists) + stored_at.index(ast.unparse(stmt))
            slot = ast.parse(ast.unparse(stmt.targets[0]), mode="eval").body  # the target read: the slot
            ast.copy_location(slot, stmt)
            fitted = ast.Call(ast.Name("__oc_fit", ast.Load()), [slot, stmt.value], [])
            stmt = ast.copy_location(ast.Assign([ast.Name(f"__oc_y_{k}", ast.Store())], fitted), stmt)
        body.append(stmt)
    carries, outs = "".join(c + ", " for c in plan.carries), "".join(
        f"__oc_y_{k}, " for k in range(len(plan.lists) + len(plan.stores)))
    src = (f"def __oc_make(__oc_take, __oc_same, __oc_fit, {value_branches.WHERE}, {''.join(f + ', ' for f in free)}):\n"
           f"    def __oc_step(__oc_carry, __oc_x):\n        {ast.unparse(loop.target)} = __oc_x\n"
           f"        ({carries}) = __oc_carry\n        pass\n        return ({carries}), ({outs})\n"
           f"    return __oc_step\n")
    make = ast.parse(src).body[0]
    for node in ast.walk(make):
        node.lineno = node.end_lineno = loop.lineno
    make.body[0].body[2:3] = body
    return make


def _step_function(loop: ast.For, plan: _Plan, frame, local: Dict[str, object], branches=()):
    """The loop body compiled as a step function with the body's own line numbers (a warning or error in a
    step names the model's line), in the model's module globals; the ``if`` at each of ``branches`` (lines
    where the step's trace stopped on a value) taken as ``torch.where`` (``value_branches.py``)."""
    stored = {n.id for n in _names(loop.body, ast.Store)} | set(_targets(loop))
    free = sorted(({n.id for n in _names(loop.body, ast.Load)} & set(local)) - stored)
    make = _AugmentedCarry(plan.carries).visit(_step_source(loop, plan, free))
    if plan.index is not None:
        make = _TakeStep(plan.index).visit(make)
    select = value_branches.Select(branches)
    make = select.visit(make)
    if select.refused:
        line, why = next(iter(select.refused.items()))
        raise NotLiftable(f"the step branches on a tensor's value at {frame.f_code.co_filename}:{line}, and not as "
                          f"torch.where: {why}")
    ast.fix_missing_locations(make)
    made: Dict[str, object] = {}
    exec(compile(ast.Module([make], []), frame.f_code.co_filename, "exec"), frame.f_globals, made)
    # tensors the step reads detached, as its carries are (lift): a closure that needs grad has the export keep
    # scan's autograd form, whose re-run by torch.onnx's type promotion stacks a SymInt ("'SymInt' object has no
    # attribute 'unsqueeze'", mambapy's deltaA[:, t] under export()'s autograd); an export needs no gradient
    return made["__oc_make"](_take, _same, _fit, value_branches.where_of, *(_closed(local[f]) for f in free))


def _closed(value):
    """A local the step reads, or a carry's first value: a tensor detached (a strided view densely copied); pieces of one row each cut before the loop (``x.split(1, d)``,
    ``x.chunk(T, d)``: ``fixed_pieces.py``) as the one tensor whose index ``t`` is piece ``t`` (a copy: pieces cut
    from one tensor, ``u0 = U[..., 0].chunk(T)`` beside ``u1 = U[..., 1].chunk(T)``, alias, which scan refuses:
    "Encountered aliasing during higher order op tracing")."""
    if isinstance(value, fixed_pieces.Pieces) and value.per_step() is not None:
        return value.per_step().detach().clone()  # its own: views of one tensor as a scan's inputs are refused
    if isinstance(value, torch.Tensor) and value._is_view() and not isinstance(value, torch.nn.Parameter):
        # a strided view (sru's x_prime = U[..., 3]) handed to the step's trace fails in torch's fake copy of it
        # ("vr must not be None for symbol s1", torch 2.13): the step reads a dense copy
        return value.detach().clone(memory_format=torch.contiguous_format)
    return value.detach() if isinstance(value, torch.Tensor) else value


def _write_back(frame, values: Dict[str, object]) -> None:
    """Rebind the model frame's carried names to the scan's final state."""
    if not values:
        return
    if sys.version_info >= (3, 13):  # PEP 667: f_locals writes through
        for name, value in values.items():
            frame.f_locals[name] = value
        return
    frame.f_locals.update(values)
    ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))


def planned(frame, by_index: bool = False) -> bool:
    """The loop at ``frame``'s line is a scan by its source (it carries a tensor or appends steps that are
    stacked), checked before anything runs: a loop over dim 0 is then run as a scan, whichever named dim
    that is (time-first ``for x_t in x``), not taken for a loop over the batch's rows (``batch_rows.py``)."""
    loop = loop_at(frame)
    if loop is None:
        return False
    local = dict(frame.f_locals)
    try:
        tree, loop = loop_flags.taken(_function_ast(frame.f_code), loop, local)
        plan = _plan(tree, loop, local, by_index)
    except NotLiftable:
        return False
    return bool(plan.lists or plan.carries or plan.stores)


def lift(frame, loop: Optional[ast.For], xs: torch.Tensor, by_index: bool = False) -> None:
    """Run ``loop`` (at ``frame``'s line) as a scan over ``xs``'s dim 0; NotLiftable says why not."""
    if loop is None:
        raise NotLiftable("its source is not a 'for' statement on that line")
    local = dict(frame.f_locals)
    tree, loop = loop_flags.taken(_function_ast(frame.f_code), loop, local)
    plan = _plan(tree, loop, local, by_index)
    if not plan.lists and not plan.carries and not plan.stores:
        raise NotLiftable("its body neither carries a tensor nor appends a step's output")
    gate = xs if isinstance(xs, GatedSteps) else None
    # the state detached: a carry that needs grad has the export trace scan's autograd form, which leaves
    # unbacked sizes of an indexed step's backward behind ("Pending unbacked symbols"); an export needs none
    steps_in = (gate.indices, gate.valid) if gate is not None else tuple(x.detach() for x in xs) \
        if isinstance(xs, tuple) else xs.detach()  # detached as the carries and closures (_step_function)
    final, ys = scan_traces.scanned_steps(lambda branches: _step_function(loop, plan, frame, local, branches), gate,
                         tuple(_closed(local[c]) for c in plan.carries), steps_in)
    carried = dict(zip(plan.carries, final))
    _write_back(frame, dict(carried, **{temp: carried[carry] for temp, carry in plan.aliases.items()}))
    site = f"{frame.f_code.co_filename}:{loop.lineno}"
    for name, y in zip(plan.lists, ys):
        local[name].append(StackedSteps(y, site))
    steps = gate.indices[:gate.count] if gate is not None else xs[0] if isinstance(xs, tuple) else xs
    for stmt, y in zip(plan.stores, ys[len(plan.lists):]):
        _store_steps(frame, stmt, plan.index, steps, y)


def _store_steps(frame, stmt: ast.Assign, index: str, steps: torch.Tensor, y: torch.Tensor) -> None:
    """``buf[..., t + k, ...] = v`` for every step at once: ``buf[..., steps + k, ...] = y`` with the step dim
    of ``y`` moved where the index's dim is left (int parts before it select, slices keep theirs)."""
    target = copy.deepcopy(stmt.targets[0])
    parts = list(target.slice.elts) if isinstance(target.slice, ast.Tuple) else [target.slice]
    at = next(k for k, p in enumerate(parts) if _step_offset(p, index) is not None)
    parts[at] = _Renamed(index, "__oc_idx").visit(parts[at])
    target.slice = ast.Tuple(parts, ast.Load()) if len(parts) > 1 else parts[0]
    put = ast.fix_missing_locations(ast.Module([ast.copy_location(
        ast.Assign([target], ast.Name("__oc_v", ast.Load())), stmt)], []))
    kept = sum(isinstance(p, ast.Slice) for p in parts[:at])
    env = dict(frame.f_locals, __oc_idx=steps, __oc_v=y.movedim(0, kept))
    exec(compile(put, frame.f_code.co_filename, "exec"), frame.f_globals, env)


class _Renamed(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


class StackedSteps:
    """Every step's output of a lifted loop, as its list's one element: ``torch.stack(L, d)`` is the scan's
    output with its step dim moved to ``d``, ``torch.cat(L, d)`` that folded into dim ``d``. Anything else
    done with it is refused naming the loop."""

    def __init__(self, y: torch.Tensor, site: str):
        self.y, self.site = y, site

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = args[0] if args else kwargs.pop("tensors", None)
        dim = args[1] if len(args) > 1 else kwargs.pop("dim", 0)
        name = getattr(func, "__name__", "")  # by name: torch.stack may be a patch's proxy of the original
        if name in ("stack", "cat", "concat", "concatenate") and isinstance(tensors, (list, tuple)) \
                and len(tensors) == 1 and isinstance(tensors[0], StackedSteps) and not kwargs and isinstance(dim, int):
            y = tensors[0].y
            if name == "stack":
                return y.movedim(0, dim % y.dim())
            d = dim % (y.dim() - 1)
            return y.movedim(0, d).flatten(d, d + 1)
        site = next((a.site for a in (tensors if isinstance(tensors, (list, tuple)) else ())
                     if isinstance(a, StackedSteps)), "the loop")
        raise UnsupportedPattern(f"{site}: the steps of a loop run as a scan are used by {func.__name__}(); "
                                 f"only torch.stack(list, dim) or torch.cat(list, dim) of the whole list is "
                                 f"supported")

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes (hasattr) see a plain object
            raise AttributeError(name)
        raise UnsupportedPattern(f"{self.site}: a step's output of a loop run as a scan is used (.{name}); only "
                                 f"torch.stack(list, dim) or torch.cat(list, dim) of the whole list is supported")


def _scan_outside_dynamo(wrapped, instance, args, kwargs):
    """A model's own ``scan`` call while the TorchScript exporter traces: torch fails far from the model
    ("could not find kernel for HigherOrderOperator scan"); said instead at the model's line, with the way out."""
    from ._warning_site import frame_site, model_frame_outside_torch
    from .when import torchscript_exporting
    if torchscript_exporting():
        raise UnsupportedPattern(f"{frame_site(model_frame_outside_torch())}: torch's scan is traced only by the "
                                 f"dynamo exporter, which writes it as an ONNX Scan; the TorchScript exporter "
                                 f"cannot trace it. Export with exporter='dynamo' (or 'auto')")
    return wrapped(*args, **kwargs)


def _register() -> None:
    from onnx_compat.patches.registry import Patch, register
    register(Patch(
        name="scan_under_torchscript",
        description="a model's own torch scan (torch._higher_order_ops.scan) met by the TorchScript exporter is "
                    "one error naming the model's line and the dynamo exporter, which writes it as an ONNX Scan",
        targets=("torch._higher_order_ops.scan:scan",),
        wrapper=_scan_outside_dynamo,
        when="export",
        optional=("torch._higher_order_ops.scan:scan",),
    ))


_register()
