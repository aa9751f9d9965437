"""Shape libraries (einops, einx) while exporting.

``einops_complex`` (either exporter)
    While exporting, ``stft``/``fft``/``view_as_complex`` give a ``ComplexPair``
    (real and imaginary tensors side by side), which answers the tensor methods
    that move axes (``reshape``, ``permute``, ``sum``, ``repeat`` ...). einops
    picks its backend by the tensor's type, knows no ``ComplexPair`` and stops
    with "Tensor type unknown to einops": band-split separation models
    ``rearrange`` the spectrogram around their mask. ``rearrange``, ``repeat``,
    ``reduce`` (sum, mean), ``pack`` and ``unpack`` act on the layout only (or
    linearly), so einops' torch backend applied to the pair is exact.
``einx_elementwise`` (either exporter)
    einx compiles each call for the operands' shapes, read as Python ints
    (``tuple(int(d) for d in x.shape)``): TorchScript freezes batch and time
    into the graph, dynamo specialises them. Its elementwise family (``add``,
    ``subtract``, ``where``, comparisons ...) needs no sizes at all: each
    operand is permuted and unsqueezed into the output's axis order, torch
    broadcasts, and output groups such as ``(b s)`` are flattens. Expressions
    outside that form (brackets, groups in an operand, axis sizes given as
    keywords, repeated axes) go to einx unchanged.

Library patches: patched only when the user's code has imported the library.
"""
from __future__ import annotations

import functools
import re
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from onnx_compat.patches._complex import ComplexPair
from onnx_compat.patches.registry import Patch, register


def _get_backend(wrapped, instance, args, kwargs):
    tensor = args[0] if args else kwargs["tensor"]
    if isinstance(tensor, ComplexPair):
        return wrapped(tensor.real)  # torch's backend: it calls the methods the pair answers
    return wrapped(*args, **kwargs)


register(Patch(
    name="einops_complex",
    description="einops rearrange/repeat/reduce/pack/unpack accept the real/imaginary pairs of the spectral "
                "patches (einops' torch backend applied to the pair)",
    targets=("einops._backends:get_backend",),
    wrapper=_get_backend,
    when="export",
    library="einops",
    signature=("tensor",),
))


# ---------------------------------------------------------------- einx's elementwise family

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
Item = object  # a name, "1", "..." or (in the output) a tuple of names: a group


def _side(text: str, groups: bool) -> Optional[List[Item]]:
    """One side's axes, or None for a form this patch leaves to einx."""
    items: List[Item] = []
    group: Optional[List[str]] = None
    for token in text.replace("(", " ( ").replace(")", " ) ").split():
        if token == "(" and group is None and groups:
            group = []
        elif token == ")" and group is not None:
            items.append(tuple(group))
            group = None
        elif token == "1" or _NAME.match(token) or (token == "..." and group is None):
            (items if group is None else group).append(token)
        else:
            return None
    names = [i for i in items if isinstance(i, str) and i not in ("1", "...")]
    if group is not None or len(names) != len(set(names)) or items.count("...") > 1:
        return None
    return items


def _parse(description: str, count: int) -> Optional[Tuple[List[List[Item]], List[Item]]]:
    left, arrow, right = description.partition("->")
    operands = [_side(part, groups=False) for part in left.split(",")]
    if len(operands) != count or any(o is None for o in operands):
        return None
    if arrow:
        output = _side(right, groups=True)
    else:  # einx's shorthand: the operand holding every axis is the output
        output = next((o for o in operands if all(set(p) <= set(o) for p in operands)), None)
    return (operands, output) if output is not None else None


def _ellipsis_rank(operands, tensors) -> Optional[int]:
    ranks = {t.dim() - (len(o) - 1) for o, t in zip(operands, tensors) if "..." in o and isinstance(t, torch.Tensor)}
    return ranks.pop() if len(ranks) == 1 else (0 if not ranks else None)


def _expand(items: Sequence[Item], rank: int) -> List[Item]:
    out: List[Item] = []
    for item in items:
        out.extend(f"...{k}" for k in range(rank)) if item == "..." else out.append(item)
    return out


def _elementary(output: Sequence[Item]) -> List[str]:
    """The output's axes one by one, groups opened, each unit axis with a name no operand has."""
    flat: List[str] = []
    for item in output:
        for name in (item if isinstance(item, tuple) else (item,)):
            flat.append(f"1#{len(flat)}" if name == "1" else name)
    return flat


def _aligned(x, axes: List[Item], order: List[str]):
    """``x`` (axes named ``axes``) permuted and unsqueezed into ``order``; a Python number passes."""
    if not isinstance(x, torch.Tensor):
        return x
    for dim in reversed([d for d, a in enumerate(axes) if a == "1"]):
        x = x.squeeze(dim)
    names = [a for a in axes if a != "1"]
    ranked = sorted(names, key=order.index)
    if ranked != names:
        x = x.permute([names.index(n) for n in ranked])
    for dim, name in enumerate(order):
        if name not in names:
            x = x.unsqueeze(dim)
    return x


def _grouped(result, output: Sequence[Item]):
    """Flatten the output's groups, from the right so the axis numbers ahead stay valid."""
    starts, at = [], 0
    for item in output:
        width = len(item) if isinstance(item, tuple) else 1
        starts.append((at, width, isinstance(item, tuple)))
        at += width
    for start, width, group in reversed(starts):
        if group and width == 0:
            result = result.unsqueeze(start)
        elif group and width > 1:
            result = result.flatten(start, start + width - 1)
    return result


def elementwise(op: Callable, description: str, tensors: Sequence) -> Optional[object]:
    """``op`` over ``tensors`` as einx's ``description`` says, or None where this form is einx's own."""
    parsed = _parse(description, len(tensors))
    if parsed is None:
        return None
    operands, output = parsed
    rank = _ellipsis_rank(operands, tensors)
    if rank is None:
        return None
    operands = [_expand(o, rank) for o in operands]
    output = [tuple(_expand(i, rank)) if isinstance(i, tuple) else i for i in _expand(output, rank)]
    order = _elementary(output)
    named = [set(a for a in o if a != "1") for o in operands]
    known = set().union(*named)
    shapes_ok = all(len(o) == (t.dim() if isinstance(t, torch.Tensor) else 0) for o, t in zip(operands, tensors))
    if not shapes_ok or any(n - set(order) for n in named) or any(a not in known for a in order if "#" not in a):
        return None  # a reduction, a size einx must be told, or operands that do not fit: einx says which
    aligned = [_aligned(t, o, order) for o, t in zip(operands, tensors)]
    return _grouped(op(*aligned), output)


def _chained(fn: Callable) -> Callable:
    return lambda *xs: functools.reduce(fn, xs)


ELEMENTWISE = {
    "add": _chained(torch.add), "multiply": _chained(torch.mul), "maximum": _chained(torch.maximum),
    "minimum": _chained(torch.minimum), "logical_and": _chained(torch.logical_and),
    "logical_or": _chained(torch.logical_or), "logaddexp": _chained(torch.logaddexp),
    "subtract": torch.sub, "true_divide": torch.true_divide, "divide": torch.true_divide,
    "floor_divide": torch.floor_divide, "where": torch.where, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge, "equal": torch.eq, "not_equal": torch.ne,
}


def _einx_op(wrapped, instance, args, kwargs):
    if kwargs or not args or not isinstance(args[0], str):
        return wrapped(*args, **kwargs)  # axis sizes or a backend given: einx's own business
    result = elementwise(ELEMENTWISE[wrapped.__name__], args[0], args[1:])
    return wrapped(*args, **kwargs) if result is None else result


register(Patch(
    name="einx_elementwise",
    description="einx's elementwise ops (add, subtract, multiply, divide, where, comparisons ...) keep batch "
                "and time dynamic: operands permuted and broadcast by torch instead of compiled for int shapes",
    targets=tuple(f"einx:{name}" for name in ELEMENTWISE),
    wrapper=_einx_op,
    when="export",
    library="einx",
    signature=("description",),
))
