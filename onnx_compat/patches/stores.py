"""``t[index] = value`` while exporting: the stores other patches make exact.

A store in the body of a branch on a tensor's value whose body only repairs
values in place (``if ds.sum() == 0: ds[ds.sum(1).eq(0)] = 1``, a length
regulator's guard against all-zero durations; ``checks.py`` decides which
branches those are) is rewritten; every other store goes to torch unchanged.
The exporters cannot keep the branch (dynamo stops on the data-dependent
``bool()``, TorchScript takes the example's side), so the body is traced
always and each of its stores is made conditional on the branch's condition:
``t[mask] = v`` becomes ``torch.where(mask & cond, v, t)`` written back into
``t``; any other index stores into a copy and keeps it where the condition
holds. Where the condition is false every store leaves ``t`` as it was, so the
traced body is eager's branch taken both ways.

``Tensor.__setitem__`` is overridden on ``torch.Tensor`` and the override
deleted afterwards; CPython then leaves the type's ``sq_ass_item`` slot filled,
which only lets C code's ``PySequence_SetItem`` reach ``__setitem__`` as Python
code does (unlike ``__getitem__``, whose ``sq_item`` would make tensors
sequences: see ``constants.py``).
"""
from __future__ import annotations

import sys
import threading
import warnings
from typing import List, NamedTuple, Optional

import torch

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.patch import idle
from onnx_compat.patches.when import torchscript_exporting

NAME = "guarded_stores"


class Guard(NamedTuple):
    """The body of a repairing branch: ``frame``'s instructions in ``[start, end)`` (bytecode offsets), its
    stores to act only where ``holds`` (a bool tensor, 0-d) is true."""
    frame: object
    start: int
    end: int
    holds: torch.Tensor


_state = threading.local()


def _guards() -> List[Guard]:
    found = getattr(_state, "guards", None)
    if found is None:
        found = _state.guards = []
    return found


def guard_body(frame, start: int, end: int, holds: torch.Tensor) -> None:
    """Make the stores ``frame`` makes between ``start`` and ``end`` conditional on ``holds``. Guards of
    frames no longer running are dropped here (a frame object cannot be weakly referenced)."""
    running = set()
    f = sys._getframe(1)
    while f is not None:
        running.add(id(f))
        f = f.f_back
    guards = _guards()
    guards[:] = [g for g in guards if id(g.frame) in running and not (g.frame is frame and g.start == start)]
    guards.append(Guard(frame, start, end, holds))


def stores_guarded() -> bool:
    """This patch is in place: a repairing branch's body may be traced (its stores will be conditional)."""
    from onnx_compat.patches.registry import _REGISTRY
    patch = _REGISTRY.get(NAME)
    return patch is not None and bool(patch._count)


def _guard_for(frame) -> Optional[Guard]:
    for guard in _guards():
        if guard.frame is frame and guard.start <= frame.f_lasti < guard.end:
            return guard
    return None


def _caller():
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code is Patch.gate.__code__
                                 or frame.f_globals.get("__name__", "").startswith(__package__)):
        frame = frame.f_back
    return frame


def _bool_mask(tensor: torch.Tensor, index) -> Optional[torch.Tensor]:
    """``index`` when it is one bool mask over ``tensor``'s leading dims (``t[mask]``), else None."""
    mask = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not 0 < mask.dim() <= tensor.dim():
        return None
    try:
        with warnings.catch_warnings():  # TorchScript's sizes are traced: compared here, not put in the graph
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            same = [int(n) for n in mask.shape] == [int(n) for n in tensor.shape[:mask.dim()]] \
                if torchscript_exporting() else tuple(mask.shape) == tuple(tensor.shape[:mask.dim()])
    except Exception:  # noqa: BLE001 - sizes that cannot be compared without a guard: the general form
        return None
    return mask if same else None


def conditional_store(tensor: torch.Tensor, index, value, holds: torch.Tensor) -> None:
    """``tensor[index] = value`` where ``holds``, nothing where not, written back into ``tensor``."""
    mask = _bool_mask(tensor, index)
    scalar = isinstance(value, (bool, int, float)) or (isinstance(value, torch.Tensor) and value.dim() == 0)
    if mask is not None and scalar:
        fill = value.to(tensor.dtype) if isinstance(value, torch.Tensor) else tensor.new_full((), value)
        where = mask.reshape(*mask.shape, *([1] * (tensor.dim() - mask.dim()))) & holds
        updated = torch.where(where, fill, tensor)
    else:
        stored = tensor.clone()
        torch._C.TensorBase.__setitem__(stored, index, value)  # torch's own store, not this patch's
        updated = torch.where(holds, stored, tensor)
    tensor.copy_(updated)


def _setitem(wrapped, instance, args, kwargs):
    if not _guards():
        idle(NAME)
        return wrapped(*args, **kwargs)
    index, value = args
    frame = _caller()
    guard = _guard_for(frame) if frame is not None and isinstance(instance, torch.Tensor) else None
    if guard is not None:
        return conditional_store(instance, index, value, guard.holds)
    idle(NAME)
    return wrapped(*args, **kwargs)


register(Patch(
    name=NAME,
    description="stores in a value branch that only repairs values in place (if ds.sum() == 0: ds[mask] = 1) "
                "are traced as torch.where on the branch's condition",
    targets=("torch:Tensor.__setitem__",),
    wrapper=_setitem,
    when="export",
    aliases=False,
))
