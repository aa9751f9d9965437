"""Eager checks of each part before any export: the part uses every input it declares.

A part that ignores its token or one of its states exports to a graph that
runs, loads and even verifies against PyTorch, and a decoder calling it in a
loop then decodes something else. Changing one input at a time and seeing
the outputs stay the same names the graph and the input, before a minute
of exporting is spent.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from onnx_compat.spec import TensorSpec

from ..pipeline.adapter import flatten
from ..spec import make_inputs
from .errors import GraphContractError


def example_feeds(specs: Sequence[TensorSpec], sizes: Dict[str, int], seed: int) -> Dict[str, torch.Tensor]:
    return make_inputs(specs, sizes, seed=seed)


def _changed(name: str, value: torch.Tensor, spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    """Another value of the same shape and dtype: other random floats; ints moved by one inside their range;
    lengths one shorter (or one longer when at 1)."""
    if name != spec.name:  # lengths
        return torch.where(value > 1, value - 1, value + 1)
    if value.dtype.is_floating_point:
        return torch.randn(value.shape, generator=gen).to(value.dtype)
    low, high = spec.values or (0, 10)
    return (value - low + 1) % max(1, high - low) + low


def check_inputs_used(graph: str, module: torch.nn.Module, specs: Sequence[TensorSpec],
                      feeds: Dict[str, torch.Tensor]) -> None:
    """Each input, changed alone, changes some output; else one ``GraphContractError`` naming it."""
    names = list(feeds)
    owner = {n: s for s in specs for n in s.onnx_names}
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        base = flatten(module(*feeds.values()))
        for name in names:
            other = dict(feeds)
            other[name] = _changed(name, feeds[name], owner[name], gen)
            got = flatten(module(*other.values()))
            if all(torch.equal(a, b) for a, b in zip(base, got)):
                raise GraphContractError(f"graph {graph!r}: input {name!r} does not change any output (changed "
                                         "alone, every output stayed the same): the part ignores it, and a "
                                         "decoder feeding it would decode something else", graph=graph,
                                         tensor=name, rule="every input is used")


def outputs_of(module: torch.nn.Module, feeds: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    with torch.no_grad():
        return flatten(module(*feeds.values()))
