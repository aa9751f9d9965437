"""Size guards that hold on a dim's whole declared range but that torch's value ranges cannot decide.

A strided framing (a conv STFT with hop ``h``, ``unfold``, ``frame()``) gives ``frames = T // h - k``, and
torch's stride and contiguity checks of the views that follow ask things like::

    Mod(1, Max(1, T//320 - 1)) != 0                 # clearvoice FRCRN, T >= 1600
    Mod(1024, 1024*(T//512) - 3072) != 0            # music2latent's encoder, T >= 8192
    (n - 1) * Min(66, 66*n - 66) == 66*n - 66       # n = T//32, a reshape's numel check

Each holds at every size of the declared range (the divisor is larger than the dividend, the ``Min`` picks
its constant), but torch's value-range analysis of ``Mod`` with a non-constant divisor bails out to
``[-(d-1), d-1]``, and it does not replace a ``Min``/``Max`` whose side is known. The guard is then issued,
fails "Not all values of T in the specified range satisfy the generated guard", and the export stops
(``Constraints violated``) -- after the whole trace, minutes on a 14 M-parameter U-Net.

While dynamo exports, a guard torch could not decide statically is looked at once more with each such atom
replaced by the side the ranges prove it equals (``Mod(a, b) = a`` when ``0 <= a < b``; ``Min(a, b) = a``
when ``a <= b``; ``Max`` likewise), innermost first, and handed back to torch's own evaluation. The
rewrite is exact on the ranges, so what torch then decides is what the guard is at every size: the dim
stays dynamic and no guard is added. A guard that is still undecided goes on as before (torch's error
names it).

Only where such a guard would stop the export: torch.export with ``prefer_deferred_runtime_asserts_over_guards``
off (its default). torch.onnx turns it on (torch 2.13), so an undecided guard there becomes a runtime assert
the ONNX graph leaves out, and the rewrite, tried on every undecided expression, only cost time (a clearvoice
FRCRN export: 147 s without it, 298 s with it).
"""
from __future__ import annotations

from typing import Optional

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register

_NAME = "range_decided_guards"
_TARGET = "torch.fx.experimental.symbolic_shapes:ShapeEnv._maybe_evaluate_static"
_MAX_REWRITES = 64  # atoms replaced in one guard; a guard with more is left to torch as it is


def _decide(wrapped, instance, args, kwargs):
    found = wrapped(*args, **kwargs)
    if found is not None or kwargs.get("compute_hint") or not args \
            or getattr(instance, "prefer_deferred_runtime_asserts_over_guards", False):
        idle(_NAME)
        return found
    ranges = kwargs.get("var_to_range")
    ranges = dict(ranges) if ranges is not None else instance.var_to_range
    expr = instance.simplify(args[0], kwargs.get("size_oblivious", False))
    rewritten = range_rewritten(expr, ranges)
    if rewritten is None:
        idle(_NAME)
        return found
    decided = wrapped(rewritten, *args[1:], **kwargs)
    if decided is None:
        idle(_NAME)
    return decided


def range_rewritten(expr, ranges) -> Optional[object]:
    """``expr`` with every ``Mod``/``Min``/``Max`` whose value the symbols' ``ranges`` pin to one of its
    arguments replaced by that argument; None when there is none."""
    changed, rewritten = False, expr
    for _ in range(_MAX_REWRITES):
        step = _one_rewrite(rewritten, ranges)
        if step is None:
            break
        rewritten, changed = step, True
    return rewritten if changed else None


def _one_rewrite(expr, ranges):
    import sympy
    for atom in sorted(expr.atoms(*_atom_types()), key=sympy.count_ops):  # innermost first
        side = _proven_side(atom, ranges)
        if side is not None:
            return expr.xreplace({atom: side})
    return None


def _atom_types():
    import sympy
    from torch.utils._sympy import functions
    return tuple({sympy.Min, sympy.Max, sympy.Mod} | {getattr(functions, n) for n in ("Mod", "PythonMod", "Min", "Max")
                                                       if hasattr(functions, n)})


def _proven_side(atom, ranges):
    """The argument ``atom`` equals at every point of ``ranges``, or None."""
    from torch.utils._sympy.value_ranges import bound_sympy
    if len(atom.args) != 2:
        return None
    a, b = atom.args
    try:
        ra, rb = bound_sympy(a, ranges), bound_sympy(b, ranges)
    except Exception:  # noqa: BLE001 - an atom the analysis cannot bound is left as it is
        return None
    kind = type(atom).__name__
    if kind in ("Mod", "PythonMod"):
        return a if ra.lower >= 0 and rb.lower > 0 and ra.upper < rb.lower else None
    if kind == "Min":
        return a if ra.upper <= rb.lower else b if rb.upper <= ra.lower else None
    if kind == "Max":
        return a if ra.lower >= rb.upper else b if rb.lower >= ra.upper else None
    return None


register(Patch(
    name=_NAME,
    description="a size guard torch cannot decide (Mod(1, T//320 - 1) != 0, a Min of a reshape's numel check) "
                "is decided over the dims' declared ranges by replacing each Mod/Min/Max whose value the ranges "
                "pin, so the dim stays dynamic instead of 'Constraints violated ... satisfy the generated guard'",
    targets=(_TARGET,),
    on_import=(_TARGET,),  # sympy and the shape environment are not loaded by a TorchScript export
    wrapper=_decide,
    when="dynamo",
    aliases=False,
    min_torch="2.1",
))
