"""A TorchScript trace whose ops depend on the example's sizes, found before it is converted.

``auto`` tries TorchScript first, the cheaper export. On a model with a Python loop over time (a recurrent cell
stepped over ``range(x.size(1))``, a list built per frame), the tracer unrolls the loop at the example's count:
the ONNX conversion of the unrolled trace, its cleanup and the verification that then fails took 4.4 s of
``export(auto)``'s 11.7 s on a small cell stepped over 37 frames, before dynamo, which writes the loop as a
``Scan``, was tried. The tracer says so as it goes: a size turned into a Python index or number on a loop's
line, or iteration over a tensor (TracerWarnings at the model's line). Only then is the model traced once more, with each dynamic
dim one step longer, and the two traces compared op by op (dead ops left out): if they differ,
the graph traced at the example cannot stand for other sizes, and the attempt stops there with the line. It is
not given up: the pipeline tries dynamo first and comes back to TorchScript in full if dynamo does not verify
(``pipeline._first_verified``), so no graph ``auto`` verified before is lost.
"""
from __future__ import annotations

import contextlib
import linecache
import re
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

from onnx_compat.errors import SizedTrace
from onnx_compat.model_state import preserved
from onnx_compat.pipeline import dims
from onnx_compat.spec import Dim, TensorSpec, example_sizes, make_inputs

# what the tracer (and the patches, at the model's line) say when Python code takes a size as a number
_SIZED = re.compile(r"Converting a tensor to a Python (index|integer)|Iterating over a tensor")
_LOOP = re.compile(r"^\s*for\b|\bfor\b.+\bin\b|\brange\(")


@contextlib.contextmanager
def checked(graph_module, model: torch.nn.Module, args: Sequence[torch.Tensor],
            inputs: Sequence[TensorSpec]) -> Iterator[None]:
    """While open, the TorchScript exporter's trace (``graph_module._trace_and_get_graph_from_model``) raises
    ``SizedTrace`` when the model's ops depend on a dynamic size."""
    other = _longer_sizes(inputs, args)
    if other is None:
        yield
        return

    def traced(original, traced_model, traced_args):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            graph, out = original(traced_model, traced_args)
        _say_again(said)
        lines = _sized_lines(said)
        if lines:
            _compare(graph, traced_model, args, inputs, other, lines)
        return graph, out
    with each_trace(graph_module, traced):
        yield


@contextlib.contextmanager
def each_trace(graph_module, traced: Callable) -> Iterator[None]:
    """While open, the TorchScript exporter's trace runs as ``traced(original, model, args)`` (``original``: its
    own ``_trace_and_get_graph_from_model``), which returns what that returns; put back afterwards."""
    original = getattr(graph_module, "_trace_and_get_graph_from_model", None)
    if original is None:
        yield
        return
    graph_module._trace_and_get_graph_from_model = lambda model, args: traced(original, model, args)
    try:
        yield
    finally:
        graph_module._trace_and_get_graph_from_model = original


def _longer_sizes(inputs: Sequence[TensorSpec], args: Sequence[torch.Tensor]) -> Optional[Dict[str, int]]:
    """The example's sizes with each dynamic dim one step longer (a step of its ``multiple``; shorter where its
    maximum is reached), or None when none can change. The first axis too: a time-first loop (``for x_t in x``
    over ``[T, B, F]``) steps over axis 0, and a loop over the batch unrolled at the example's batch is as wrong
    at another batch as one over time is at another length."""
    example = example_sizes(inputs, dict(zip(dims.onnx_names(inputs), args)))
    longer, changed = dict(example), False
    for spec in inputs:
        for axis, dim in spec.dynamic_axes().items():
            if longer[dim.name] != example[dim.name]:
                continue
            longer[dim.name] = _other_size(dim, example[dim.name])
            changed |= longer[dim.name] != example[dim.name]
    return longer if changed else None


def _other_size(dim: Dim, size: int) -> int:
    for other in (size + dim.multiple, size - dim.multiple):
        if other >= dim.min and (dim.max is None or other <= dim.max):
            return other
    return size


def _say_again(said: List[warnings.WarningMessage]) -> None:
    """The trace's warnings go on to the capture's own record (the report names their lines)."""
    for w in said:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _sized_lines(said: List[warnings.WarningMessage]) -> List[str]:
    """The lines of loops (``for``, a comprehension, ``range()``) where a size became a Python number. A slice
    bound (``x[..., : x.shape[-1] // 2]``, a rotary half in five of the zoo's transformers encoders) is said the
    same way but traced as a size: a second trace there cost 0.14-0.2 s of a 0.5-0.8 s export for nothing."""
    found = [f"{w.filename}:{w.lineno}" for w in said
             if issubclass(w.category, torch.jit.TracerWarning) and _SIZED.search(str(w.message))
             and (str(w.message).startswith("Iterating") or _LOOP.search(linecache.getline(w.filename, w.lineno)))]
    return list(dict.fromkeys(found))


def _compare(graph, model, args, inputs, other: Dict[str, int], lines: List[str]) -> None:
    """Trace again at ``other`` sizes (the model's state kept as the first trace left it, the warnings
    dropped) and raise ``SizedTrace`` if the ops differ."""
    again = tuple(make_inputs(inputs, other, seed=1).values())
    with warnings.catch_warnings(), preserved(model), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            second = torch.jit._get_trace_graph(model, again, strict=False, _force_outplace=False)[0]
        except Exception:  # the model refuses those sizes: nothing is learnt, the export goes on
            return
    first_ops, second_ops = _ops(graph), _ops(second)
    if first_ops == second_ops:
        return
    example = {n: s for n, s in zip(dims.onnx_names(inputs), args)}
    at = ", ".join(f"{name}={size}" for name, size in other.items()
                   if size != example_sizes(inputs, example)[name])
    raise SizedTrace(f"TorchScript's trace depends on the example's sizes: {len(second_ops)} ops at {at}, "
                     f"{len(first_ops)} at the example (a loop or list sized by a number taken from a size, "
                     f"unrolled at the example's count: {', '.join(lines[:3])})", lines=lines)


def _ops(graph) -> List[str]:
    """The kinds of the trace's live ops, in order (blocks included)."""
    copy = graph.copy()
    torch._C._jit_pass_dce(copy)
    kinds: List[str] = []

    def walk(block) -> None:
        for node in block.nodes():
            kinds.append(node.kind())
            for inner in node.blocks():
                walk(inner)
    walk(copy)
    return kinds
