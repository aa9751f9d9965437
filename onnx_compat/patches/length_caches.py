"""Caches sized by the longest call made before the export, emptied while an export traces.

Rotary position embeddings keep their cos/sin tables in a cache that grows with the longest sequence seen
(``if T > self.seq_len_cached: self.seq_len_cached = T; self.cos_cached = ...``), and models that keep
such a table from construction (``max_seq_len_cached = max_position_embeddings``) grow it the same way.
Exported after an eager call at 60 frames, the example (37 frames) does not grow it: the trace slices the
60-row table held as a constant, so the graph holds only up to 60 frames. The dynamo exporter says so
("requested dynamic at any size but the traced model holds only up to 60", a bound it cannot explain);
the TorchScript exporter writes a graph that is silently limited to it, and a verification at lengths
under 60 cannot see it (measured on torch 2.13, issue #47, 1).

A module whose attributes name themselves caches (``cache`` in the name), a length (an int, or a 0-d
integer tensor) and tensors with a dim of that length (buffers or plain attributes, never parameters),
holds such a table. While an export traces the model, each such cache is emptied (the length 0, the
tables cut to 0 rows along that dim), so the model's own code grows it from the traced length: the graph
computes the table from the input's size and holds at every length. Everything is put back when the trace
ends. A model that cannot grow an emptied cache fails that export, and the pipeline's retry without the
patches gives the plain export (which ``cache_limits`` explains).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from onnx_compat.patches.patch import Patch, acted, through
from onnx_compat.patches.registry import in_place, register

NAME = "length_caches"


@dataclass
class Cache:
    """One module's cache: its length attributes (all holding ``size``) and the tensors sized by it."""

    path: str
    module: torch.nn.Module
    size: int
    lengths: List[str] = field(default_factory=list)
    tables: List[Tuple[str, int]] = field(default_factory=list)  # (attribute, the dim of length ``size``)

    def describe(self) -> str:
        where = self.path or type(self.module).__name__
        tables = ", ".join(f"{where}.{name} {list(self._value(name).shape)}" for name, _ in self.tables)
        lengths = ", ".join(f"{where}.{name} = {self.size}" for name in self.lengths)
        return f"{tables} with {lengths}: a cache sized by the longest call made before the export"

    def _value(self, name):
        return self.module._buffers[name] if name in self.module._buffers else vars(self.module)[name]


def _state(module: torch.nn.Module) -> Dict[str, object]:
    """A module's attributes named as caches: plain attributes and buffers, never parameters."""
    own = dict(vars(module))
    own.update({k: v for k, v in module._buffers.items() if v is not None})
    return {k: v for k, v in own.items() if "cache" in k.lower() and not isinstance(v, torch.nn.Parameter)}


def _length(value) -> int:
    """The length an attribute holds (an int, a 0-d integer tensor), or 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        return int(value)
    return 0


def caches(root: torch.nn.Module) -> List[Cache]:
    """Every module of ``root`` holding a length-keyed cache (see the module's docstring)."""
    found = []
    for path, module in root.named_modules():
        state = _state(module)
        for size in sorted({_length(v) for v in state.values()} - {0}):
            cache = Cache(path, module, size, [k for k, v in state.items() if _length(v) == size])
            cache.tables = [(k, list(v.shape).index(size)) for k, v in state.items()
                            if isinstance(v, torch.Tensor) and v.dim() > 0 and size in v.shape]
            if cache.tables:
                found.append(cache)
    return found


def _emptied(cache: Cache, name: str):
    value = cache._value(name)
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return torch.zeros_like(value)
    if isinstance(value, torch.Tensor):
        axis = dict(cache.tables)[name]
        return value.narrow(axis, 0, 0).clone()
    return 0


def _put(module: torch.nn.Module, name: str, value) -> None:
    if name in module._buffers:
        module._buffers[name] = value
    else:
        vars(module)[name] = value


@contextlib.contextmanager
def emptied(root) -> None:
    """While the block runs, every length-keyed cache of ``root`` is empty; put back afterwards (the model's
    own growth while tracing included)."""
    found = caches(root) if isinstance(root, torch.nn.Module) and _wanted() else []
    saved = []
    try:
        for cache in found:
            for name in cache.lengths + [t for t, _ in cache.tables if t not in cache.lengths]:
                saved.append((cache.module, name, cache._value(name)))
                _put(cache.module, name, _emptied(cache, name))
        if found:
            acted(NAME)
        yield found
    finally:
        for module, name, value in reversed(saved):
            _put(module, name, value)


def _wanted() -> bool:
    return in_place(NAME)


def cache_limits(root, high: int) -> str:
    """What in ``root`` holds exactly ``high`` rows, when dynamo says the traced model holds a dim only up to
    ``high``: tensors the modules keep that are no parameters (buffers, plain attributes) with a dim of ``high``,
    and the modules' ints equal to it; "" when nothing does. Said as the likely cause: a table sized by the
    longest call before the export, or by construction."""
    if not isinstance(root, torch.nn.Module) or high <= 1:
        return ""
    found = []
    for path, module in root.named_modules():
        own = {k: v for k, v in vars(module).items() if isinstance(v, (int, torch.Tensor))}
        own.update({k: v for k, v in module._buffers.items() if v is not None})
        tables = [f"{path or 'model'}.{k} {list(v.shape)}" for k, v in own.items()
                  if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and high in v.shape]
        if tables:
            found += tables + [f"{path or 'model'}.{k} = {high}" for k, v in own.items() if _length(v) == high]
    if not found:
        return ""
    return (f"the model holds {', '.join(found)}: a table of {high} rows, sized when it was built or by the longest "
            f"call made before the export, that the graph slices instead of computing it from the input's size")


register(Patch(
    name=NAME,
    description="caches sized by the longest call before the export (rotary cos/sin tables and their length) are "
                "emptied while an export traces, so the model grows them from the traced length in the graph",
    # no target of its own: the trace hook of padded_lengths_int (int_calls.py) empties them when this is in place
    targets=(),
    wrapper=through,
    when="export",
))
