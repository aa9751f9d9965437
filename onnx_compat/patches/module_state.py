"""State a lifted loop's step keeps on modules, carried by the scan as one more part of its state.

snntorch's neurons, and cells written the same way, keep their state on the module: ``self.mem = ...`` every
step, read again by the next. A scan step may change nothing outside itself, so dynamo refuses such a step
("HOP: Unsafe side effect"; non-strict export's buffer hook is "marked as skipped"). Here the loop's first
step runs before the scan, as the Python loop's first iteration, with every module write recorded; each tensor
attribute it wrote is then one more carry: put on its module before each traced step, read back after it, and
the module left as the step found it, so nothing written inside the step outlives it. torch lets a step do
that through ``_disable_side_effect_safety_checks_for_current_subtracer``; non-strict export's buffer hook is
set aside while the step is traced (the writes it would map never leave the step). After the scan each
attribute holds the last step's value, as after the Python loop.

A Python value (a number, a flag) that the first step changes on a module is refused: a scan runs one traced
step, so a counter would count once. Where torch has no such escape, the refusal stays what it was.
"""
from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch
from torch.utils import _pytree

from onnx_compat.errors import NotLiftable, StateOnModules

_PLAIN = (int, float, bool, str, type(None))


def _unsafe_call():
    utils = getattr(torch, "_dynamo", None) and getattr(torch._dynamo, "utils", None)
    return getattr(utils, "_disable_side_effect_safety_checks_for_current_subtracer", None)


def _tensors(value) -> bool:
    """A tensor, or a tuple or list of them (an LSTM cell's ``(h, c)``): state a scan can carry."""
    if isinstance(value, torch.Tensor):
        return not isinstance(value, torch.nn.Parameter)
    leaves = _pytree.tree_leaves(value) if isinstance(value, (tuple, list)) else []
    return bool(leaves) and all(isinstance(v, torch.Tensor) for v in leaves)


def _changes_a_number(module, name: str, value) -> bool:
    """A Python number, flag or string on a module set to another one (a tensor cleared to None is no such)."""
    old = getattr(module, name, value)
    return isinstance(value, _PLAIN) and isinstance(old, _PLAIN) and old != value


class Kept:
    """The (module, attribute) pairs a step writes tensors to, in the order first written; a value is carried
    as its tensors, flat, and put back in its own structure."""

    def __init__(self, refused: StateOnModules):
        self.refused = refused
        self.sites: List[Tuple[torch.nn.Module, str]] = []
        self.specs: list = []

    @contextlib.contextmanager
    def recording(self):
        """Run the first step with every module write recorded (a changed Python value refused)."""
        original = torch.nn.Module.__setattr__
        sites = self.sites

        def recorded(module, name, value):
            if _tensors(value):
                if not any(m is module and n == name for m, n in sites):
                    sites.append((module, name))
            elif _changes_a_number(module, name, value):
                raise NotLiftable(f"its step changes {type(module).__name__}.{name} (a Python "
                                  f"{type(value).__name__}, {getattr(module, name)!r} -> {value!r}) on the module: "
                                  f"a scan runs one traced step, so such a value would change once, not every step")
            original(module, name, value)

        torch.nn.Module.__setattr__ = recorded
        try:
            yield
        finally:
            torch.nn.Module.__setattr__ = original
        if not sites:
            raise self.refused

    def values(self) -> Tuple[torch.Tensor, ...]:
        """The state the first step left, flat; each attribute's structure kept for ``_put``."""
        flat, self.specs = [], []
        for module, name in self.sites:
            leaves, spec = _pytree.tree_flatten(getattr(module, name))
            if not leaves or not all(isinstance(v, torch.Tensor) for v in leaves):
                raise NotLiftable(f"its step leaves {type(module).__name__}.{name} as a "
                                  f"{type(getattr(module, name)).__name__}, which a scan cannot carry")
            flat += [v.detach() for v in leaves]
            self.specs.append(spec)
        return tuple(flat)

    def _read(self) -> Tuple[torch.Tensor, ...]:
        return tuple(v for m, n in self.sites for v in _pytree.tree_leaves(getattr(m, n)))

    def held(self, step, own: int):
        """``step`` with the modules' state as the carries after its ``own`` ones."""
        unsafe = _unsafe_call()

        def run(carry, x_t):
            return unsafe(self._step, step, own, carry, x_t)
        return run

    def _step(self, step, own: int, carry, x_t):
        before = [getattr(m, n) for m, n in self.sites]
        self._put(carry[own:])
        new, outs = step(tuple(carry[:own]), x_t)
        after = self._read()
        for (module, name), value in zip(self.sites, before):
            setattr(module, name, value)
        return tuple(new) + after, outs

    def _put(self, flat) -> None:
        """Each attribute set from its share of the flat tensors, in its own structure."""
        at = 0
        for (module, name), spec in zip(self.sites, self.specs):
            setattr(module, name, _pytree.tree_unflatten(list(flat[at:at + spec.num_leaves]), spec))
            at += spec.num_leaves

    def leave(self, final) -> None:
        """The modules hold the last step's state, as after the Python loop."""
        self._put(final)


def kept_for(refused: StateOnModules) -> Optional[Kept]:
    """A ``Kept`` to run the loop with, or None where torch has no way for a step to touch modules."""
    return Kept(refused) if _unsafe_call() is not None else None


@contextlib.contextmanager
def buffer_hooks_aside(kept: Optional[Kept]):
    """Non-strict export maps each buffer assigned while it traces to its proxy through a global hook that dynamo
    will not trace; the step's writes are undone inside it, so while the scan's step is traced the hook is set
    aside (and put back whatever happens)."""
    hooks = getattr(torch.nn.modules.module, "_global_buffer_registration_hooks", None)
    if kept is None or not hooks:
        yield
        return
    saved = dict(hooks)
    hooks.clear()
    try:
        yield
    finally:
        hooks.update(saved)
