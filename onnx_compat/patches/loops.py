"""Python loops whose trip count is a dynamic size, met while the dynamo exporter traces.

A length regulator loops over the batch (``for h, d in zip(x, durations)``
or ``for i in range(x.shape[0])``); a codec loops over chunk offsets
``range(0, length - step, stride)``. Neither exporter writes a Python loop as
a graph loop: the TorchScript exporter unrolls it at the example's count
(silently: no size of its trace is known to be dynamic), the dynamo exporter
specialises the dim, so the exported model refuses any other batch or length
("Got invalid dimensions for input") or fails with ``DimSpecialized`` far
from the loop (measured on torch 2.13).

While the dynamo exporter traces, iterating over a tensor whose first dim is
dynamic, or ``range()`` of a dynamic size in the model's own code (read off
the calling bytecode), raises one error naming the source line and the dim, so
the fix (tensor ops over the whole dim, or a static size)
is clear. Torch's own code is left alone. A ``range()`` whose steps are proven the same numbers at every
size is not sized by the dim and runs at the example's values (``constant_ranges.py``: EnCodec's
``range(0, length, stride)`` with the stride the whole length, one step). One loop is lifted instead of
refused: iterating over a dynamic batch gives one row standing for every row
(``batch_rows.py``), which a length regulator's ``repeat_interleave`` and
``pad_sequence`` take as batched graph ops; anything else done with it is
refused naming the line. A loop whose body is a step carrying tensors (a
recurrent cell over ``x.unbind(1)`` or ``range(x.size(1))``, its steps stacked)
runs as torch's ``scan`` and is exported as an ONNX ``Scan`` (``scan_loops.py``);
the refusal of any other loop says why it was not. A ``math`` function of a
dynamic size (``math.log2(T)`` for a trip count) or its ``bit_length()`` takes one past the dim's declared
maximum (the model then pads to one static length, verified at new sizes), and without one is refused where it
is taken.
Under TorchScript the loop is unrolled as before and its rows remembered: a
length regulator's rows padded by ``pad_sequence`` are lifted the same way
(``unrolled_rows.py``); a ``for`` over ``x.unbind(d)`` is said as a
TracerWarning at its line, so a failed export names it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dis
import functools
import math
import sys
import warnings
from typing import Dict, Optional, Tuple

import torch

from onnx_compat.errors import RangeBoundToName
from onnx_compat.patches.registry import Patch, register
from ._calls import tensor_call
from .recurrent import _refuse
from . import constant_ranges, range_names, scan_loops, source_rewrites
from .batch_rows import BatchRow
from .unrolled_rows import remember_rows
from .size_math import symbolic_size
from .when import torchscript_exporting

_SymInt = getattr(torch, "SymInt", None)


def _past_patches(frame):
    while frame is not None and (frame.f_globals.get("__name__", "").startswith(__package__)
                                 or frame.f_code is Patch.gate.__code__):
        frame = frame.f_back
    return frame


def _model_frame():
    """The model code's frame that made the call (iterating a tensor counts as the model's own
    ``unbind``), or None when torch or a patch did."""
    frame = _past_patches(sys._getframe(1))
    if frame is not None and frame.f_code is torch.Tensor.__iter__.__code__:
        frame = _past_patches(frame.f_back)  # __iter__ itself may be wrapped (padded_lengths)
    if frame is None:
        return None
    module = frame.f_globals.get("__name__", "")
    return None if module.split(".")[0] == "torch" or module.startswith(__package__) else frame


def _refuse_at(frame, what: str, size, why: str = "") -> None:
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    why = f" (not run as a scan: {why})" if why else ""
    message = (f"{where}: {what} the dynamic size {size.node.expr}: a Python loop or list sized by it is unrolled "
               f"at the example's value, so the exported graph would hold only that many steps{why}. Write it "
               f"with tensor ops over the whole dim, or a loop that carries state as a step function run by "
               f"torch._higher_order_ops.scan (an ONNX Scan), or make the dim static")
    tree = scan_loops._function_ast(frame.f_code)
    if what.startswith("range()") and tree is not None and range_names.bound_loop(tree, frame.f_lineno)[0]:
        # seq = range(n) before its for: the capture runs again with the range in the for (range_names.py)
        raise RangeBoundToName(message, where, frame.f_code.co_name)
    _refuse(message)


def _as_scan(frame, xs_of, by_index: bool = False):
    """Run the model's loop at ``frame``'s line as a scan (``scan_loops.py``): None when it was, else why not."""
    loop = scan_loops.loop_at(frame)
    try:
        scan_loops.lift(frame, loop, xs_of(loop), by_index)
    except scan_loops.NotLiftable as why:
        return str(why)
    return None


def _unbind(wrapped, instance, args, kwargs):
    """Iterating a tensor is ``unbind(0)``; wrapping ``__iter__`` itself would move its TracerWarning
    ("Iterating over a tensor ...") from the model's line to the wrapper's."""
    b = tensor_call(instance, args, kwargs, ("input", "dim"), {"dim": 0})
    x = None if b is None else b["input"]
    if torchscript_exporting():  # the loop is unrolled; its rows are remembered for a length regulator
        rows = wrapped(*args, **kwargs)
        _say_unrolled(x, b["dim"], len(rows))
        return remember_rows(x, rows) if isinstance(x, torch.Tensor) and b["dim"] == 0 else rows
    frame = _model_frame()
    if frame is not None and isinstance(x, torch.Tensor) and isinstance(b["dim"], int) and x.dim() > 0:
        size = x.shape[b["dim"]]
        if symbolic_size(size) and b["dim"] % x.dim() == 0 and _iterating() and _rows_are_padded() \
                and not scan_loops.planned(frame):
            return (BatchRow(x),)  # every row at once: a length regulator is lifted (batch_rows.py)
        if symbolic_size(size):
            dim = b["dim"] % x.dim()
            via_iter = _iterating()

            def steps(loop):  # enumerate(x.unbind(d)): the step's index goes with its slice
                enumerated = scan_loops.check_unbound(loop, via_iter)
                return (torch.arange(size), x.movedim(dim, 0)) if enumerated else x.movedim(dim, 0)
            why = _as_scan(frame, steps)
            if why is None:
                return ()  # the loop ran as a scan: its Python loop runs no step
            _refuse_at(frame, f"unbinding (iterating over) dim {dim} of a tensor of shape "
                              f"{tuple(x.shape)} loops over", size, why)
    return wrapped(*args, **kwargs)


def _say_unrolled(x, dim, steps: int) -> None:
    """A ``for`` over ``x.unbind(d)`` in model code is unrolled by the TorchScript tracer at the example's
    count without a word (iterating the tensor itself warns, an explicit ``unbind`` does not): the same
    TracerWarning, said at the loop's line, so a failed export names it."""
    frame = _model_frame()
    if frame is None or not isinstance(x, torch.Tensor) or _iterating() or scan_loops.loop_at(frame) is None:
        return
    warnings.warn_explicit(torch.jit.TracerWarning(
        f"Iterating over a tensor (unbind of dim {dim}, {steps} steps) might cause the trace to be incorrect: "
        f"the loop is unrolled at the example's {steps} steps. Under the dynamo exporter a loop carrying state "
        f"runs as a scan (an ONNX Scan)"), torch.jit.TracerWarning, frame.f_code.co_filename, frame.f_lineno,
        module=frame.f_globals.get("__name__"))


def _rows_are_padded() -> bool:
    """The lifted rows end in ``pad_sequence``, which only the ``pad_sequence`` patch takes: where it steps
    aside (its native release) or is left out, the loop is refused as before."""
    from onnx_compat.patches.registry import _REGISTRY
    patch = _REGISTRY.get("pad_sequence")
    return patch is not None and bool(patch._count) and not patch.steps_aside("dynamo")


def _iterating() -> bool:
    """The unbind was made by ``Tensor.__iter__`` (a Python loop over the tensor)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is torch.Tensor.__iter__.__code__:
            return True
        if not (frame.f_globals.get("__name__", "").startswith(__package__) or frame.f_code is Patch.gate.__code__):
            return False
        frame = frame.f_back
    return False


def called_name(code, offset: int):
    """The name a call at ``offset`` calls (``range``, ``len``), read off the bytecode, or None.

    Walks back from the ``CALL`` over its arguments' stack effects to the instruction that pushed
    the callable; straight-line code only (anything else: None)."""
    listed = _listed(code)
    at = next((k for k, ins in enumerate(listed) if ins.offset == offset), None)
    while at is not None and at + 1 < len(listed) and listed[at].opname in ("PRECALL", "KW_NAMES"):
        at += 1  # Python 3.11 may make the call from its PRECALL
    if at is None or listed[at].opname != "CALL":
        return None
    need, depth, k = listed[at].arg, 0, at - 1
    while k >= 0 and listed[k].opname in ("PRECALL", "KW_NAMES", "CACHE"):
        k -= 1
    for ins in reversed(listed[:k + 1]):
        if ins.opname.startswith(("JUMP", "POP_JUMP", "FOR_ITER", "RETURN")):
            return None
        depth += dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
        if depth > need:
            return ins.argval if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") else None
        if ins.is_jump_target:  # entered from elsewhere too: what was below on the stack is not known here
            return None
    return None


@functools.lru_cache(maxsize=256)
def _listed(code):
    return list(dis.get_instructions(code))


def _index(wrapped, instance, args, kwargs):
    """``range(size)`` is run as a scan or refused, and a ``math`` function of a size (``math.log2(T)``,
    whose value torch would freeze without a word) or ``float()`` of one that ``int_calls`` did not redirect
    (its guard specialises the dim, naming no line) is refused: ``len(tensor)`` and other int uses are left
    to torch, whose strict retry keeps some of them symbolic (ECAPA-style masks: ``expand(len(lengths), L)``)."""
    frame = _model_frame()
    if frame is not None and symbolic_size(instance) and called_name(frame.f_code, frame.f_lasti) == "range":
        same = constant_ranges.example_index(frame, instance)
        if same is not None:
            return same  # the range's steps are the same numbers at every size (constant_ranges.py)
        why = _as_scan(frame, lambda loop: scan_loops.scanned_range(loop, instance, frame), by_index=True)
        if why is None:  # the loop ran as a scan: its range made empty, no Python step
            return scan_loops.emptied_range(scan_loops.loop_at(frame), frame)
        _refuse_at(frame, "range() takes", instance, why)
    if frame is not None and symbolic_size(instance) and _math_call(frame):
        return _past_the_most(frame, instance, "a math function takes")
    if frame is not None and symbolic_size(instance) and called_name(frame.f_code, frame.f_lasti) == "float":
        _refuse(f"{frame.f_code.co_filename}:{frame.f_lineno}: float() of the dynamic size {instance.node.expr} "
                f"goes through SymInt.__index__, which specialises the dim to the example's value (a size ratio "
                f"as a Python float). The model's own float() calls keep a size in the graph while onnx_compat "
                f"exports (size_floats.py), but this one was not reached from the model's classes: compute it as "
                f"a tensor (torch.full((), size, dtype=torch.float32)), or make the dim static")
    return wrapped(*args, **kwargs)


def _math_call(frame) -> bool:
    """The call at the frame's line is a ``math`` function: ``math.log2(T)``, or ``log2(T)`` after ``from math
    import log2, ceil`` (H-Transformer-1D pads to ``2 ** ceil(log2(n))``)."""
    name = called_name(frame.f_code, frame.f_lasti)
    if name == "math":
        return True
    return name is not None and getattr(frame.f_globals.get(name), "__self__", None) is math


def _bit_length(wrapped, instance, args, kwargs):
    """``(T - 1).bit_length()`` (padding to a power of two) makes a dynamic size a Python int at the example's
    value; torch then specialises the dim (``DimSpecialized``, naming no line): taken one past the declared
    maximum, or refused where it is taken (``_past_the_most``)."""
    frame = _model_frame()
    if frame is not None and symbolic_size(instance):
        return _past_the_most(frame, instance, "bit_length() takes").bit_length()
    return wrapped(*args, **kwargs)


def _past_the_most(frame, size, what: str) -> int:
    """The number a math function or ``bit_length()`` takes for a dynamic size: one past its declared maximum
    (``Dim(..., max=N)``), so a power of two computed from it is above every size the dim may take, and a model
    that pads to it (a parallel scan over log2 levels, an FFT length) pads every input to that one static length,
    over a fixed number of levels. Right where padding further changes nothing (a causal scan cut back to the
    input's length, a product padded with identities): the verification at new sizes decides. Without a declared
    maximum the example's value would be frozen into the graph: refused at the line."""
    most = declared_most(size)
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if most is None:
        _refuse(f"{where}: {what} the dynamic size {size.node.expr} as a Python number: the example's value is "
                f"frozen into the graph, so a trip count or a pad width computed from it (a scan over log2(T) levels, "
                f"padding to a power of two) holds only at the example's length. Declare the dim's maximum "
                f"(Dim(name, max=N): the number is then taken one past it, and the model pads every input to that "
                f"one length), compute it with tensor ops, or make the dim static")
    warnings.warn(f"{where}: {what} the dynamic size {size.node.expr}: taken as {most + 1}, one past its declared "
                  f"maximum, so what the model pads to or loops over from it is the same at every size")
    source_rewrites.assume(f"{where}: {what.rsplit(' takes', 1)[0]} of the size taken at {most + 1} "
                           f"(one past the declared maximum {most}): every input padded or looped over as for it, "
                           f"which is right only where padding further changes nothing")
    return most + 1


# the declared maximum of each dynamic input dim, by (input index, axis), while export() captures with dynamo: it
# hands torch bounded ``Dim.DYNAMIC`` hints, whose bounds are checked after the trace, not known during it
_DECLARED: contextvars.ContextVar = contextvars.ContextVar("declared_maxima", default={})


@contextlib.contextmanager
def declared_maxima(maxima: Dict[Tuple[int, int], int]):
    token = _DECLARED.set(dict(maxima))
    try:
        yield
    finally:
        _DECLARED.reset(token)


def declared_most(size) -> Optional[int]:
    """The largest value of a dynamic size over its dims' declared ranges (torch's own, for named ``Dim``s with a
    ``max``; ``declared_maxima`` for export()'s hints), or None where one is unbounded."""
    import sympy  # here, not at import: a TorchScript export loads no sympy (test_registry)
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy
    env = getattr(size.node, "shape_env", None)
    try:
        ranges = dict(env.var_to_range)
        for symbol in size.node.expr.free_symbols:
            most = _declared_for(env, symbol)
            if most is not None:
                ranges[symbol] = ValueRanges(ranges[symbol].lower, most)
        upper = bound_sympy(size.node.expr, ranges).upper
    except Exception:  # noqa: BLE001 - no shape environment, or an expression its ranges do not bound
        return None
    return int(upper) if isinstance(upper, sympy.Integer) else None


def _declared_for(env, symbol) -> Optional[int]:
    """The declared maximum of the input dim a symbol was made for (its source: ``inputs[i].size()[axis]``)."""
    declared = _DECLARED.get()
    for source in env.var_to_sources.get(symbol, ()):
        index, axis = getattr(getattr(source, "base", None), "index", None), getattr(source, "idx", None)
        if (index, axis) in declared:
            return declared[(index, axis)]
    return None


def _loop_use(wrapped, instance, args, kwargs):
    if _SymInt is not None and isinstance(instance, _SymInt):
        return (_bit_length if getattr(wrapped, "__name__", "") == "bit_length" else _index)(
            wrapped, instance, args, kwargs)
    return _unbind(wrapped, instance, args, kwargs)


register(Patch(
    name="dynamic_loops",
    description="a Python loop over a dynamic dim (iterating a tensor, range(size)) in model code runs as a "
                "torch scan (an ONNX Scan) under dynamo when its body is a step carrying tensors; otherwise "
                "one error naming the source line, the dim and why, instead of a specialised graph",
    targets=("torch:unbind", "torch:Tensor.unbind") + (
        ("torch:SymInt.__index__", "torch:SymInt.bit_length") if _SymInt is not None else ()),
    wrapper=_loop_use,
    when="export",  # under TorchScript only to remember the rows of a loop (unrolled_rows.py)
    aliases=False,
    requires=("onnx_translations",),
))
