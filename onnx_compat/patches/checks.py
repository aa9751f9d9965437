"""Checks of tensor values in model code (``assert``, ``torch._assert``, ``if ...: raise``).

Models guard their numerics with ``assert (envelope > 1e-11).all()``,
``torch._assert(mask.any(), "...")`` or ``if torch.isnan(x).any(): raise``.
The dynamo exporter traces with values unknown, so the ``bool()`` of such a
tensor stops the export ("Could not guard on data-dependent expression").
The TorchScript exporter evaluates it on the example and traces the branch
taken, which for a check is the right one (the example passes it), but warns
of a baked constant (which ``export(strict=True)`` refuses); for a check that
warning is dropped.

A check of a value must not decide whether a model exports. While the dynamo
exporter traces, a data-dependent ``bool()`` is looked up in the calling
code: when one of its two branches does nothing but raise, it is a check; the
other branch is taken and the condition recorded with ``torch._assert_async``
(kept in the exported program; ``torch.onnx`` drops assertion nodes, as ONNX
has no operator that fails on a value). A branch that only prints, warns or
logs (``if torch.min(y) < -1.: print(...)``, torchfcpe's range report in the
second sweep) changes no output: it is skipped, nothing asserted. Any other
data-dependent branch is real control flow and still fails, with the source
line named, unless its body only repairs values in place.

A repairing branch (a length regulator's ``if ds.sum() == 0:
ds[ds.sum(dim=1).eq(0)] = 1``, with or without a log line) is taken both
ways only on a degenerate input, and its body is a set of subscript stores.
Such a body is traced whichever way the example goes, each store made
conditional on the branch's condition (``stores.py``: ``torch.where``), so the
graph does what eager does on either side, under both exporters (TorchScript
would otherwise bake the example's side silently). A body that does anything
else (assigns a name, calls a method ending in ``_``, an augmented
assignment, another branch) is real control flow as before: refused naming
the line under dynamo, the example's side with its warning under TorchScript.
Its reports run while the body is traced (a log line said once per export).
"""
from __future__ import annotations

import dis
import functools
import sys
import threading
import warnings
from typing import Optional

import torch

from onnx_compat.errors import DataDependentBranch  # in the one family; importable from here as before
from onnx_compat.patches.registry import Patch, register
from .when import torchscript_exporting
from ._warning_site import said_at
from .stores import guard_body, stores_guarded

_SYMBOLIC_SHAPES = "torch.fx.experimental.symbolic_shapes"

# A conditional jump taken when the value is True (the suffix names it), by Python release.
_JUMP_IF = {f"POP_JUMP{kind}_IF_{v}": v == "TRUE" for kind in ("", "_FORWARD", "_BACKWARD") for v in ("TRUE", "FALSE")}
# What ends a branch that only builds its exception (local assignments such as ``msg = f"..."`` do not).
_ENDS = ("JUMP", "POP_JUMP", "RETURN", "STORE_ATTR", "STORE_SUBSCR", "STORE_GLOBAL", "DELETE_ATTR",
         "DELETE_SUBSCR", "FOR_ITER", "YIELD", "SEND", "RERAISE")
_LOOKAHEAD = 64  # instructions a raising branch may take to build its exception
_REPORTS = {"print", "warn", "warning", "info", "debug", "error", "exception", "critical", "log"}
_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD")
# What a repairing body may not hold: other flow, a name or attribute bound, a raise, an import, a context.
_NOT_REPAIRS = ("JUMP", "POP_JUMP", "RETURN", "FOR_ITER", "YIELD", "SEND", "RERAISE", "RAISE", "IMPORT",
                "STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF", "STORE_ATTR", "DELETE", "INPLACE_",
                "SETUP", "BEFORE_WITH", "PUSH_EXC_INFO", "MAKE_FUNCTION")


_depth = threading.local()


@functools.lru_cache(maxsize=256)
def _instructions(code):
    listed = list(dis.get_instructions(code))
    return listed, {ins.offset: i for i, ins in enumerate(listed)}


def _raises(listed, start: int) -> bool:
    """The instructions from ``start`` on build an exception and raise it, with no other effect on flow."""
    for ins in listed[start:start + _LOOKAHEAD]:
        if ins.opname == "RAISE_VARARGS":
            return True
        if ins.opname.startswith(_ENDS):
            return False
    return False


def _only_reports(listed, start: int, end: int) -> bool:
    """``listed[start:end]`` is one or more statements that only print, warn or log (``if y.min() < -1:
    print(...)``), then go on where the other branch goes."""
    block = listed[start:end]
    if not block or block[-1].opname != "POP_TOP" or len(block) > _LOOKAHEAD:
        return False
    if any(ins.opname.startswith(_ENDS + ("STORE_", "DELETE_", "RAISE", "IMPORT")) for ins in block):
        return False
    return any(ins.argval in _REPORTS for ins in block if ins.opname in _LOADS)


def _branches(code, offset: int):
    """(the jump's listed instructions, index of its fall-through, index of its target, whether it jumps when
    the value is True) for the conditional jump at ``offset``, or None."""
    listed, index = _instructions(code)
    i = index.get(offset)
    if i is None:
        return None
    if listed[i].opname == "TO_BOOL":  # Python 3.13: the conversion comes just before the jump
        i += 1
    jump = listed[i]
    if jump.opname not in _JUMP_IF or jump.argval not in index:
        return None
    return listed, i + 1, index[jump.argval], _JUMP_IF[jump.opname]


def check_outcome(code, offset: int) -> Optional[bool]:
    """The truth value that avoids the raising (or only reporting) branch of the conditional jump at
    ``offset``, or None when that instruction is no such check (another use of ``bool``, or neither branch
    just raises or reports)."""
    found = _branches(code, offset)
    if found is None:
        return None
    listed, through, target, jumps_when = found
    falls_through_raises = _raises(listed, through)
    target_raises = _raises(listed, target)
    if falls_through_raises == target_raises:
        return jumps_when if not falls_through_raises and reports_only(code, offset) else None
    return jumps_when if falls_through_raises else not jumps_when


def reports_only(code, offset: int) -> bool:
    """The branch the conditional jump at ``offset`` skips only prints, warns or logs: a range check that
    reports (torchfcpe's ``if torch.min(y) < -1.: print(...)``), which changes no output."""
    found = _branches(code, offset)
    return found is not None and found[2] > found[1] and _only_reports(found[0], found[1], found[2])


def _only_repairs(listed, start: int, end: int) -> bool:
    """``listed[start:end]`` is statements that store into a subscript (``t[mask] = v``) or only report,
    at least one store: evaluating its expressions changes nothing, so the stores are the body's effect."""
    block, statement, stores = listed[start:end], [], 0
    if not block or len(block) > 4 * _LOOKAHEAD:
        return False
    for ins in block:
        if ins.opname.startswith(_NOT_REPAIRS) or (ins.opname == "BINARY_OP" and ins.argrepr.endswith("=")):
            return False  # ``t[:, 0] += 1`` changes a view in place before its store
        if ins.opname in _LOADS and isinstance(ins.argval, str) and ins.argval.endswith("_") \
                and not ins.argval.startswith("__"):
            return False  # an in-place method (``x.clamp_()``) acts whether or not the store is kept
        statement.append(ins)
        if ins.opname == "STORE_SUBSCR":
            stores, statement = stores + 1, []
        elif ins.opname == "POP_TOP":
            if not any(i.argval in _REPORTS for i in statement if i.opname in _LOADS):
                return False  # a call for its effect
            statement = []
    return stores > 0 and not statement


def repair_entry(code, offset: int) -> Optional[bool]:
    """The truth value that enters the branch of the conditional jump at ``offset`` when that branch (the
    one it skips, with no ``else``) only repairs values by subscript stores, else None."""
    found = _branches(code, offset)
    if found is None:
        return None
    listed, through, target, jumps_when = found
    if target <= through or not _only_repairs(listed, through, target):
        return None
    return not jumps_when


def _enter_repair(frame, instance: torch.Tensor, entered: bool) -> bool:
    """Trace the repairing body whichever way the example goes, its stores acting where eager's would."""
    listed, through, target, _ = _branches(frame.f_code, frame.f_lasti)
    holds = (instance if instance.dtype == torch.bool else instance != 0).reshape(())
    guard_body(frame, listed[through].offset, listed[target].offset, holds if entered else ~holds)
    return entered


def _repairs(frame) -> Optional[bool]:
    """``repair_entry`` at ``frame``'s jump, when the store patch that makes the body exact is in place."""
    if frame is None or not stores_guarded():
        return None
    return repair_entry(frame.f_code, frame.f_lasti)


def _caller():
    """The first frame outside onnx_compat's registry and this module (the code that called bool())."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__") == __name__ or frame.f_code is Patch.gate.__code__):
        frame = frame.f_back
    return frame


_FUNCTIONAL_BOOL = "torch._subclasses.functional_tensor:FunctionalTensor.__bool__"


def _bool(wrapped, instance, args, kwargs):
    if torchscript_exporting():
        return _traced_bool(wrapped, instance, args, kwargs)
    return _symbolic_bool(wrapped, instance, args, kwargs)


def _traced_bool(wrapped, instance, args, kwargs):
    """TorchScript evaluates the check on the example, which is right for a check: only the
    "might cause the trace to be incorrect" warning (a baked constant to the pipeline) is dropped.
    A repairing branch is traced with its stores conditional; other branches keep the warning, said at
    the model's line."""
    frame = _caller()
    if frame is not None and check_outcome(frame.f_code, frame.f_lasti) is None:
        entered = _repairs(frame)
        if entered is not None and isinstance(instance, torch.Tensor):
            return _enter_repair(frame, instance, entered)
    if frame is None or check_outcome(frame.f_code, frame.f_lasti) is None:
        return said_at(frame, wrapped, *args, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return wrapped(*args, **kwargs)


def _symbolic_bool(wrapped, instance, args, kwargs):
    """Torch function modes (the exporter's) call ``bool()`` again from inside: only the outermost
    call, whose caller is the model's code, decides."""
    from .constants import known_values  # a buffer or constant whose values are known (constants.py)
    values = known_values(instance)
    if values is not None and values.size == 1:
        return bool(values.reshape(()))
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        if _depth.value == 1 and _without_values(instance) and _is_check(_caller()):
            return _as_check(instance, None)  # not asked of torch: its failed guard leaves an unbacked read behind
        return wrapped(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - only a guard on a data-dependent value is a check's to take
        if _depth.value > 1 or not _data_dependent(exc):
            raise
        return _as_check(instance, exc)
    finally:
        _depth.value -= 1


def _without_values(tensor) -> bool:
    """A fake tensor computed from the inputs (its values unknown while dynamo traces)."""
    from torch._subclasses.fake_tensor import is_fake
    return isinstance(tensor, torch.Tensor) and is_fake(tensor) and tensor.numel() == 1


def _is_check(frame) -> bool:
    return frame is not None and check_outcome(frame.f_code, frame.f_lasti) is not None


def _data_dependent(exc: BaseException) -> bool:
    """Whether ``exc`` is symbolic shapes' guard on a data-dependent value. Its module is looked up, not
    imported: importing it (and sympy) costs 0.3 s, and a process that has not loaded it cannot have raised it."""
    shapes = sys.modules.get(_SYMBOLIC_SHAPES)
    cls = getattr(shapes, "GuardOnDataDependentSymNode", None)
    return cls is not None and isinstance(exc, cls)


def _as_check(instance: torch.Tensor, exc: BaseException) -> bool:
    frame = _caller()
    if frame is None:
        raise exc
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    outcome = check_outcome(frame.f_code, frame.f_lasti)
    if outcome is None:
        entered = _repairs(frame)
        if entered is None:
            raise DataDependentBranch(where, exc, frame.f_code.co_name) from exc
        return _enter_repair(frame, instance, entered)
    if reports_only(frame.f_code, frame.f_lasti):  # eager goes on either way: nothing to assert
        return outcome
    holds = instance if instance.dtype == torch.bool else instance != 0
    torch._assert_async(holds if outcome else ~holds, f"value check at {where} failed")
    return outcome


register(Patch(
    name="value_checks",
    description="assert / torch._assert / `if ...: raise` on a tensor's value no longer stop the dynamo "
                "exporter (the non-raising branch is traced, the check kept as torch._assert_async) nor "
                "count as baked constants under TorchScript; a branch whose body only stores into tensors "
                "(if d.sum() == 0: d[mask] = 1) is traced with its stores conditional (guarded_stores)",
    # a capture below autograd (a gradient taken in forward: autograd_in_forward.py) traces functional tensors,
    # whose own __bool__ reads item() without asking Tensor.__bool__
    targets=("torch:Tensor.__bool__", _FUNCTIONAL_BOOL),
    optional=(_FUNCTIONAL_BOOL,),
    wrapper=_bool,
    when="export",
    requires=("guarded_stores",),
))
