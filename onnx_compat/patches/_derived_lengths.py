"""Lengths computed from a declared lengths input keep its convention: their maximum is the same function of
the padded dim.

A front end turns sample lengths into frame lengths before it masks (espnet's STFT:
``olens = (ilens + 2 * (n_fft // 2) - n_fft) // hop + 1``, a conv subsampling: ``(lengths - 1) // 2 + 1``) and
reads the new lengths back as numbers (``make_pad_mask(olens)``: ``olens.long().tolist()``). A monotone
non-decreasing element-wise function ``f`` keeps the maximum: ``max(f(lengths)) == f(max(lengths))``, and the
longest of a declared lengths input is the padded dim, so the longest frame length is ``f(padded dim)``, the
very size of the padded frames the front end computed.

While a declared lengths input is in use (``lengths.declared``) a ``TorchFunctionMode`` follows it through
such functions: adding or subtracting a number (or a size), multiplying by a number >= 0, dividing by one
> 0 (true, floor or trunc division), ceil/floor/round/trunc, clamp, and dtype casts. Each result is
``Derived``: its maximum is the function applied to the padded size, computed only when something reads it
(the same op on the traced 0-d size under TorchScript, the same arithmetic on the dim's symbol under dynamo).
A function that does not keep the maximum (negation, ``c - lengths``, a remainder, a per-sequence operand,
two lengths combined) gives a ``Broken`` result: reading its values back as a Python list is refused, naming
the line that read it and the line that made it.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from ._warning_site import frame_site, model_frame_outside_torch

_ADD = {"add", "__add__", "__radd__", "__iadd__", "add_"}
_SUB = {"sub", "subtract", "__sub__", "__isub__", "sub_"}
_MUL = {"mul", "multiply", "__mul__", "__rmul__", "__imul__", "mul_"}
_FLOORDIV = {"floor_divide", "__floordiv__", "__ifloordiv__", "floor_divide_"}
_DIV = {"div", "divide", "true_divide", "__truediv__", "__itruediv__", "div_"}
_ROUND = {"ceil": math.ceil, "floor": math.floor, "trunc": math.trunc, "fix": math.trunc, "round": round}
_CLAMP = {"clamp", "clip", "clamp_min", "clamp_max", "clamp_", "clamp_min_", "clamp_max_"}
_CAST = {"long", "int", "short", "float", "double", "half", "to", "type", "type_as", "clone", "detach",
         "contiguous", "cpu"}
# element-wise functions of the lengths that do not keep their maximum
_BREAKS = {"neg", "negative", "__neg__", "rsub", "__rsub__", "remainder", "__mod__", "fmod", "abs", "__abs__",
           "__rtruediv__", "__rfloordiv__", "reciprocal", "pow", "__pow__", "__rpow__", "maximum",
           "minimum", "where"}
_BREAK_TEXT = {("neg", "negative", "__neg__"): "negation", ("rsub", "__rsub__"): "a number minus the lengths",
               ("remainder", "__mod__", "fmod"): "a remainder", ("abs", "__abs__"): "abs()",
               ("__rtruediv__", "__rfloordiv__", "reciprocal"): "a number divided by the lengths",
               ("pow", "__pow__", "__rpow__"): "a power"}
_FAMILY = _ADD | _SUB | _MUL | _FLOORDIV | _DIV | _CLAMP | _CAST | _BREAKS | set(_ROUND) | {f"{n}_" for n in _ROUND}
# the functions whose keyword arguments of these names are sizes a maximum read as the padded size may be
_SIZE_ARGS = {"istft": ("length",)}


def site() -> str:
    """``file:line`` of the model's code that called the op (neither torch's nor onnx_compat's)."""
    return frame_site(model_frame_outside_torch())


class Derived:
    """A tensor computed from a declared (or derived) lengths tensor by a function that keeps the maximum."""

    def __init__(self, tensor, parent, parent_tensor, step: Callable, text: str, where: str):
        self.tensor, self.parent, self.parent_tensor = tensor, parent, parent_tensor
        self.step, self.text, self.where = step, text, where
        self._size = None

    @property
    def name(self) -> str:
        return self.parent.name

    @property
    def chain(self) -> str:
        """How it was computed, from the declared input on (for error messages)."""
        before = self.parent.chain if isinstance(self.parent, Derived) else f"lengths {self.parent.name!r}"
        return f"{before}, then {self.text} at {self.where}"

    def size(self, tensor, frame, exporting_torchscript: bool, example_max: Callable):
        """The maximum as the exporter traces it: the function applied to the parent's, once per export."""
        if self._size is None:
            parent = self.parent.size(self.parent_tensor, frame) if not isinstance(self.parent, Derived) else \
                self.parent.size(self.parent_tensor, frame, exporting_torchscript, example_max)
            if isinstance(parent, torch.Tensor):
                parent = parent.to(self.parent_tensor.dtype)
            self._size = self.step(parent)
            if exporting_torchscript:
                _check(self, example_max(self.tensor), example_max(self._size), frame)
        return self._size


def _check(derived: Derived, longest, computed, frame) -> None:
    from onnx_compat.errors import SpecError
    if longest != computed:
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the model"
        raise SpecError(f"{where}: reads the longest of {derived.chain} as that function of the padded dim "
                        f"({computed}), but the example's longest is {longest}: the function does not keep the "
                        f"maximum at this example")


class Broken:
    """A tensor computed from lengths by a function that does not keep their maximum."""

    def __init__(self, name: str, text: str, where: str):
        self.name, self.text, self.where = name, text, where

    def refusal(self, read: str, at: str) -> str:
        return (f"{at}: reads {read} of a tensor computed from the lengths input {self.name!r} by {self.text} at "
                f"{self.where}, a function that does not keep the longest length: its values are not a function "
                f"of the padded dim, so the graph would hold the example's numbers. Compute what is read with "
                f"tensor ops, or from the lengths by adding, multiplying or dividing by positive numbers")


def _number(value) -> bool:
    return isinstance(value, (numbers.Real, torch.SymInt, torch.SymFloat)) and not isinstance(value, bool)


def _scalar(value, torchscript: bool) -> bool:
    """An operand that is one number for the whole batch: a Python number, a size's symbol, or (TorchScript)
    a 0-d traced size."""
    if _number(value):
        return True
    return torchscript and isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex()


def _positive(value, strict: bool) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and (value > 0 if strict else value >= 0)


def _trunc_div(a, b):
    """``trunc(a / b)`` for b > 0, of ints or a size's symbol (floor division when a is not negative)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    if isinstance(a, torch.SymInt) and not statically_known_true(a >= 0):
        return torch.sym_ite(a >= 0, a // b, -((-a) // b))
    return a // b if a >= 0 else -((-a) // b)


def _symbolic(name: str, others, kwargs, source, result) -> Optional[Callable]:
    """The same function on the dim's symbol (dynamo), or None when it has no symbolic form here."""
    base = name.strip("_")
    c = others[0] if others else None
    if name in _ADD:
        return lambda s: s + c
    if name in _SUB:
        return lambda s: s - c
    if name in _MUL:
        return lambda s: s * c
    if name in _FLOORDIV:
        return lambda s: s // c
    if name in _DIV:
        mode = kwargs.get("rounding_mode")
        if mode == "trunc":
            return (lambda s: _trunc_div(s, c)) if isinstance(c, int) else (lambda s: math.trunc(s / c))
        return (lambda s: s // c) if mode == "floor" else (lambda s: s / c)
    if base in _ROUND:
        return lambda s: _ROUND[base](s) if isinstance(s, (float, torch.SymFloat)) else s
    if name in _CLAMP:
        low, high = _bounds(name, others, kwargs)
        return lambda s: torch.sym_min(torch.sym_max(s, low) if low is not None else s, high) \
            if high is not None else (torch.sym_max(s, low) if low is not None else s)
    if name in _CAST:
        if result.dtype == torch.bool:
            return None
        if result.is_floating_point() and not source.is_floating_point():
            return torch.sym_float
        if source.is_floating_point() and not result.is_floating_point():
            return lambda s: torch.sym_int(s) if isinstance(s, (float, torch.SymFloat)) else s
        return lambda s: s
    return None


def _bounds(name: str, others, kwargs) -> Tuple[object, object]:
    if name.startswith("clamp_min"):
        return (others[0] if others else kwargs.get("min")), None
    if name.startswith("clamp_max"):
        return None, (others[0] if others else kwargs.get("max"))
    low = others[0] if others else kwargs.get("min")
    high = others[1] if len(others) > 1 else kwargs.get("max")
    return low, high


def _why_not(name: str, others, kwargs, torchscript: bool) -> Optional[str]:
    """Why this op on lengths does not keep their maximum, or None when it does."""
    if name in _BREAKS:
        return next((text for names, text in _BREAK_TEXT.items() if name in names), f"{name}()")
    if name in _ADD | _SUB:
        ok = len(others) == 1 and _scalar(others[0], torchscript) and "alpha" not in kwargs
        return None if ok else f"{name}() with a per-sequence operand"
    if name in _MUL:
        return None if len(others) == 1 and _positive(others[0], strict=False) else \
            f"{name}() by something other than a number >= 0"
    if name in _FLOORDIV | _DIV:
        return None if len(others) == 1 and _positive(others[0], strict=True) else \
            f"{name}() by something other than a number > 0"
    if name in _CLAMP:
        low, high = _bounds(name, others, kwargs)
        ok = all(b is None or _scalar(b, torchscript) for b in (low, high))
        return None if ok else f"{name}() with per-sequence bounds"
    if name.strip("_") in _ROUND:
        return None if not others and not kwargs.get("decimals") else f"{name}() to decimals"
    return None


class Follow(TorchFunctionMode):
    """Follows declared lengths through the functions that keep their maximum (see the module's docstring).

    ``lookup(tensor)`` gives the record of a followed tensor (the declared one's, or ``Derived``); results are
    recorded in ``derived`` (or ``broken``), kept alive until the export's model call ends."""

    def __init__(self, lookup: Callable, torchscript: bool, size_of: Callable):
        super().__init__()
        self.lookup, self.torchscript, self.size_of = lookup, torchscript, size_of
        self.derived: Dict[int, Derived] = {}
        self.broken: Dict[int, Tuple[torch.Tensor, Broken]] = {}
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if not self.torchscript and name in _SIZE_ARGS:
            kwargs = self._as_sizes(name, kwargs)
        # an in-place op on followed lengths: the record's parent is their values before it
        before = args[0].clone() if _inplace(name) and args and isinstance(args[0], torch.Tensor) and \
            not self.paused and self.lookup(args[0]) is not None else None
        result = func(*args, **kwargs)
        if self.paused or not isinstance(result, torch.Tensor) or name not in _FAMILY:
            return result  # only element-wise functions of the lengths' values (no index, mask or view)
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        followed = [(t, self.lookup(t)) for t in tensors]
        followed = [(t, r) for t, r in followed if r is not None]
        broken = [self.broken[id(t)][1] for t in tensors if id(t) in self.broken and self.broken[id(t)][0] is t]
        if broken:
            self._mark(result, broken[0])
        elif followed:
            self._record(func, args, kwargs, result, followed, before)
        return result

    def _as_sizes(self, name: str, kwargs):
        """A maximum read as the padded size handed on as a size (espnet's ``istft(length=ilens.max())``) is the
        dim's symbol under dynamo, not a 0-d tensor whose value the op would read (a data-dependent symbol)."""
        def size(value):
            found = self.size_of(value) if isinstance(value, torch.Tensor) else None
            return value if found is None or isinstance(found, torch.Tensor) else found
        return {k: size(v) if k in _SIZE_ARGS[name] else v for k, v in kwargs.items()}

    def _record(self, func, args, kwargs, result, followed, before) -> None:
        name = func.__name__
        source, record = followed[0]
        if name in _ADD | _MUL and len(args) == 2 and args[1] is source and len(followed) == 1:
            args = (source, args[0])  # c + lengths, c * lengths
        others = list(args[1:])
        if len(followed) > 1:
            why = f"{name}() of two lengths tensors"
        elif not args or args[0] is not source:
            why = "a number minus the lengths" if name in _SUB else f"{name}() with the lengths as its second operand"
        elif result.dim() != source.dim():
            why = f"{name}() with an operand of another shape"
        elif result.dtype == torch.bool or result.is_complex():
            why = f"{name}() to {result.dtype}"
        else:
            why = _why_not(name, others, kwargs, self.torchscript)
        where = site()
        step = None if why is not None else self._step(func, name, others, kwargs, source, result)
        if step is None:
            self._mark(result, Broken(record.name, why or f"{name}()", where))
            return
        self.broken.pop(id(result), None)
        if before is not None and isinstance(record, Derived):
            record.tensor = before  # its values before the in-place op, for its own check
        self.derived[id(result)] = Derived(result, record, source if before is None else before, step,
                                           _text(name, others, kwargs), where)

    def _mark(self, result, broken: Broken) -> None:
        """``result`` does not keep the maximum (an in-place op may have made a followed tensor so)."""
        self.derived.pop(id(result), None)
        self.broken[id(result)] = (result, broken)

    def _step(self, func, name, others, kwargs, source, result) -> Optional[Callable]:
        if self.torchscript:  # the same op on the traced 0-d size
            return lambda s: func(*((s.clone() if _inplace(name) else s,) + tuple(others)), **kwargs)
        return _symbolic(name, others, kwargs, source, result)

    def find(self, tensor) -> Optional[Derived]:
        hit = self.derived.get(id(tensor))
        return hit if hit is not None and hit.tensor is tensor else None

    def find_broken(self, tensor) -> Optional[Broken]:
        hit = self.broken.get(id(tensor))
        return hit[1] if hit is not None and hit[0] is tensor else None


def _inplace(name: str) -> bool:
    return name in _FAMILY and ((name.endswith("_") and not name.endswith("__")) or name.startswith("__i"))


def _text(name: str, others, kwargs) -> str:
    shown = ["a size" if isinstance(o, (torch.Tensor, torch.SymInt, torch.SymFloat)) else repr(o) for o in others]
    shown += [f"{k}={v!r}" for k, v in kwargs.items() if isinstance(v, (str, numbers.Real))]
    return f"{name}({', '.join(shown)})"
