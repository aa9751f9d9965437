"""The valid range of integer inputs, read from the ops that index with them.

A unit vocoder with speaker and language embeddings of size 2 fails on the
generated inputs (integers in [0, 10)) with ``IndexError: index out of range
in self`` from ``F.embedding``, which names neither the input nor the fix.
``infer_int_ranges`` runs the model once on the example under a
``TorchFunctionMode`` that follows each integer input through the ops that
keep its values (casts, views, slicing, ``unbind``) to the ops that index
with it (``F.embedding``, ``embedding_bag``, ``one_hot``, ``index_select``,
``gather``, ``tensor[idx]``): the input's range is then ``[0, n)`` for the
smallest table ``n`` it indexes. Indices are clamped into the table during
this run, so the example's values cannot stop it.

An input that reaches an index only after arithmetic (``emb(ids + 1)``), or
indexes a tensor computed from the inputs (``frames[:, last]``: its size may
be dynamic), has no range that can be read off: ``IntRangeError`` names it,
the op and ``values=``. Inputs that never index anything keep the default
range.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Set, Tuple, Union

import torch
from torch.overrides import TorchFunctionMode

from onnx_compat.errors import SpecError
from onnx_compat.spec import TensorSpec, forward_arguments

# Ops whose result holds the same values as their first tensor argument.
_KEEP_VALUES = frozenset((
    "to", "type", "long", "int", "short", "cpu", "cuda", "contiguous", "clone", "detach", "view", "reshape",
    "view_as", "reshape_as", "unsqueeze", "squeeze", "flatten", "unflatten", "transpose", "permute", "t",
    "movedim", "expand", "expand_as", "repeat", "select", "narrow", "unbind", "chunk", "split", "__getitem__",
    "flip", "roll", "tile", "broadcast_to",
))
# Ops that read a tensor's values without deriving an index from them.
_READ_ONLY = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
                        "__ge__", "size", "dim", "numel", "__len__", "__format__", "__repr__", "max", "min",
                        "amax", "amin", "any", "all"))


class IntRangeError(SpecError):
    """An integer input indexes a table only through arithmetic, so its valid range is not known."""

    def __init__(self, input: str, op: str, why: str) -> None:
        super().__init__(f"integer input {input!r} reaches {op} {why}, so its valid range cannot be "
                         f"inferred: declare it with TensorSpec({input!r}, ..., values=(low, high))")
        self.input, self.op = input, op


@dataclass
class IntRanges:
    """``values`` per integer input (``(low, high)``, high exclusive) and one note per inference."""

    values: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


@dataclass
class _Origin:
    input: str
    exact: bool  # the tensor holds the input's values (not something computed from them)


def _name(func) -> str:
    return getattr(func, "__name__", repr(func)).split(".")[-1]


def _index_uses(name: str, args, kwargs):
    """``[(index tensor, table size, table)]`` for an op that indexes with a tensor, else [] (the table is
    None for ``one_hot``, whose size is a number)."""
    get = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name in ("embedding", "embedding_bag"):
        if _is_index(get(0, "input")):  # F.embedding(input, weight)
            idx, weight = get(0, "input"), get(1, "weight")
        else:  # torch.embedding(weight, indices)
            weight, idx = get(0, "weight"), get(1, "indices")
        return [(idx, weight.shape[0], weight)] if isinstance(weight, torch.Tensor) else []
    if name == "one_hot":
        classes = get(1, "num_classes", -1)
        return [(get(0, "input"), classes, None)] if isinstance(classes, int) and classes > 0 else []
    if name in ("index_select", "gather", "take_along_dim"):
        table, dim, idx = get(0, "input"), get(1, "dim"), get(2, "index")
        return [(idx, table.shape[dim], table)] if isinstance(dim, int) and isinstance(table, torch.Tensor) else []
    if name == "__getitem__":
        return _subscript_uses(args[0], args[1])
    return []


def _subscript_uses(table: torch.Tensor, key):
    """Tensor indices in ``table[key]`` before any Ellipsis, with the size of the axis each indexes."""
    uses, axis = [], 0
    for part in key if isinstance(key, tuple) else (key,):
        if part is Ellipsis:
            break
        if part is None:
            continue
        if _is_index(part) and axis < table.dim():
            uses.append((part, table.shape[axis], table))
        axis += 1
    return uses


def _is_index(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() \
        and value.dtype != torch.bool


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


class _Follow(TorchFunctionMode):
    """Follows integer inputs through the model's torch calls; records the tables they index."""

    def __init__(self, inputs: Mapping[str, torch.Tensor], data: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.origin: Dict[int, _Origin] = {id(t): _Origin(name, True) for name, t in inputs.items()}
        self.data: Set[int] = {id(t) for t in data}  # computed from some input: sizes may vary
        self.alive: List[torch.Tensor] = list(inputs.values()) + list(data)  # ids stay unique during the run
        self.sizes: Dict[str, List[Tuple[str, int]]] = {name: [] for name in inputs}
        self.derived: Dict[str, str] = {}  # input -> an index op fed with a value computed from it
        self.varying: Dict[str, str] = {}  # input -> an index op into a tensor computed from the inputs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        uses = _index_uses(name, args, kwargs)
        clamped = {}
        for idx, size, table in uses:
            found = self.origin.get(id(idx))
            if found is not None:
                self._record(found, name, int(size), table is not None and id(table) in self.data)
                clamped[id(idx)] = idx.clamp(0, max(int(size) - 1, 0))
        if clamped:
            args = tuple(clamped.get(id(a), a) if isinstance(a, torch.Tensor) else a for a in args)
            args = tuple(tuple(clamped.get(id(p), p) if isinstance(p, torch.Tensor) else p for p in a)
                         if isinstance(a, tuple) else a for a in args)
            kwargs = {k: clamped.get(id(v), v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        result = func(*args, **kwargs)
        self._propagate(name, args, kwargs, result)
        return result

    def _record(self, found: _Origin, op: str, size: int, varying: bool) -> None:
        if not found.exact:
            self.derived.setdefault(found.input, op)
        elif varying:
            self.varying.setdefault(found.input, op)
        else:
            self.sizes[found.input].append((op, size))

    def _propagate(self, name: str, args, kwargs, result) -> None:
        if any(id(t) in self.data for t in _tensors((args, kwargs))):
            for out in _tensors(result):
                self.data.add(id(out))
                self.alive.append(out)
        if name in _READ_ONLY:
            return
        sources = [self.origin[id(t)] for t in _tensors((args, kwargs)) if id(t) in self.origin]
        if not sources:
            return
        first = next(iter(_tensors(args[:1])), None)
        exact = name in _KEEP_VALUES and first is not None and id(first) in self.origin
        for out in _tensors(result):
            if id(out) in self.origin:
                continue
            source = self.origin[id(first)] if exact else sources[0]
            self.origin[id(out)] = _Origin(source.input, exact and source.exact)
            self.alive.append(out)


def _call(model, inputs: Sequence[TensorSpec], examples: Mapping[str, torch.Tensor]):
    pairs = forward_arguments(model, inputs)
    args = [examples[n] for n, arg in pairs if arg is None]
    kwargs = {arg: examples[n] for n, arg in pairs if arg is not None}
    with torch.no_grad():
        model(*args, **kwargs)


def infer_int_ranges(model: torch.nn.Module, inputs: Sequence[TensorSpec],
                     examples: Union[Mapping[str, torch.Tensor], Sequence[torch.Tensor]]) -> IntRanges:
    """``values`` for each integer input without ``values=`` that indexes a table, read from the table.

    ``examples``: the example tensors by ONNX name, or in ONNX order (as
    ``TensorSpec.onnx_names`` lists them). Raises ``IntRangeError`` for an
    input that reaches an index op only through arithmetic.
    """
    names = [n for spec in inputs for n in spec.onnx_names]
    examples = dict(examples) if isinstance(examples, Mapping) else dict(zip(names, examples))
    wanted = {s.name: examples[s.name] for s in inputs
              if s.values is None and not s.dtype.is_floating_point and s.dtype not in (torch.bool,)
              and not s.dtype.is_complex}
    out = IntRanges()
    if not wanted:
        return out
    follow = _Follow(wanted, list(examples.values()))
    with follow:
        _call(model, inputs, examples)
    for name in wanted:
        out.values.update(_conclude(name, follow, out.notes))
    return out


def _conclude(name: str, follow: _Follow, notes: List[str]) -> Dict[str, Tuple[int, int]]:
    sizes = follow.sizes[name]
    if name in follow.derived:
        raise IntRangeError(name, follow.derived[name], "after arithmetic on its values")
    if name in follow.varying:
        raise IntRangeError(name, follow.varying[name], "as an index into a tensor computed from the inputs, "
                                                        "whose size may vary with them")
    if not sizes:
        return {}
    op, size = min(sizes, key=lambda s: s[1])
    tables = sorted({f"{o} of {n}" for o, n in sizes})
    notes.append(f"{name}: values=(0, {size}) inferred from the op indexing with it: {', '.join(tables)}"
                 + (f" (the smallest: {op} of {size})" if len(tables) > 1 else ""))
    return {name: (0, size)}
