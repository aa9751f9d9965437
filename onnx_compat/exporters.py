"""Run one exporter on a model whose I/O is already flat (see ``io_adapter``).

Both exporters are called the same way here, always under ``patched()``, with
every warning they raise captured for the report instead of printed.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import onnx
import torch

from . import flags
from .registry import patched
from .safety import preserved
from .spec import Dim, TensorSpec, size_name
from .graph import all_nodes
from .weights import WeightsFolder

EXPORTERS = ("dynamo", "torchscript")
EXPORT_PARAMS = flags.EXPORT_PARAMS
HAS_DYNAMO = flags.HAS_DYNAMO
_TORCHSCRIPT = {"dynamo": False} if "dynamo" in EXPORT_PARAMS else {}  # torch.onnx.export's flag for it

# TracerWarnings whose cause is a value frozen into the graph.
_BAKED = re.compile(r"Converting a tensor to a Python|Iterating over a tensor|"
                    r"torch\.tensor results are registered as constants|might cause the trace to be incorrect")
# Noise every export raises; nothing the user can act on.
_NOISE = re.compile(r"legacy TorchScript-based ONNX export|Constant folding - Only steps=1|"
                    r"LeafSpec|torchvision is not installed|Exporting a model while it is in training mode|"
                    r"Using padding='same' with even kernel|create_rename_mapping")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _noise(record: warnings.WarningMessage) -> bool:
    """Exporter chatter, and torch's own deprecation notices (a user's deprecations are kept)."""
    if _NOISE.search(str(record.message)):
        return True
    return issubclass(record.category, (DeprecationWarning, FutureWarning)) and \
        os.path.abspath(record.filename or "").startswith(_TORCH_DIR)


@dataclass
class Captured:
    """Warnings raised during one export, sorted by what they mean."""

    baked: List[str] = field(default_factory=list)
    other: List[str] = field(default_factory=list)
    # how torch.onnx.export(dynamo=True) obtained the graph: each capture strategy it tried, in order
    capture: List[str] = field(default_factory=list)
    # the exporter's output as bytes, when it gave bytes (TorchScript, in memory): ONNX Runtime can load
    # these instead of a re-serialised proto (78 MB for the 12 x 256 Conformer: 0.16 s)
    serialized: Optional[bytes] = field(default=None, repr=False)

    def add(self, record: warnings.WarningMessage) -> None:
        text = f"{record.category.__name__}: {str(record.message).splitlines()[0]} ({record.filename}:{record.lineno})"
        if issubclass(record.category, torch.jit.TracerWarning) and _BAKED.search(str(record.message)):
            if text not in self.baked:
                self.baked.append(text)
        elif not _noise(record) and text not in self.other:
            self.other.append(text)


@contextlib.contextmanager
def _quiet_logs():
    """The dynamo exporter logs every optional op set it skips (torchvision's, say)."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _onnx_names(specs: Sequence[TensorSpec]) -> List[str]:
    return [n for spec in specs for n in spec.onnx_names]


def _axes(specs: Sequence[TensorSpec]) -> Dict[str, Dict[int, Dim]]:
    """Dynamic axes per ONNX name, lengths tensors included (their batch axis)."""
    out: Dict[str, Dict[int, Dim]] = {}
    for spec in specs:
        axes = spec.dynamic_axes()
        out[spec.name] = axes
        for axis in spec.lengths:
            out[size_name(spec.name, axis)] = {0: axes[0]} if 0 in axes else {}
    return out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WRAPPERS = ("TorchExportError", "ConversionError", "OnnxExporterError")


def error_line(exc: BaseException) -> str:
    """The root cause in one line: exporters wrap the real error in a generic one
    whose message starts with a banner; the cause is the ``<class 'X'>: ...`` line."""
    while exc.__cause__ is not None and type(exc).__name__ in _WRAPPERS:
        exc = exc.__cause__
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("<class '") and "'>: " in line:
            kind, _, message = line.partition("'>: ")
            return f"{kind[len('<class '):].split('.')[-1]}: {message}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def wanted_dynamic(specs: Sequence[TensorSpec]) -> Dict[str, Dict[int, str]]:
    """``{onnx_name: {axis: dim_name}}`` of every dim the specs want dynamic."""
    return {name: {a: d.name for a, d in axes.items()} for name, axes in _axes(specs).items()}


def run(exporter: str, model: torch.nn.Module, args: Tuple[torch.Tensor, ...], inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec], opset: Optional[int] = None,
        patch_options: Optional[dict] = None, let_dims_specialize: bool = False,
        fold: bool = True, weights: Optional[WeightsFolder] = None) -> Tuple[onnx.ModelProto, Captured]:
    """Export ``model(*args)`` with ``exporter`` and return the ModelProto.

    ``fold=False``: the TorchScript exporter leaves constant folding to the
    cleanup that follows (ONNX Runtime folds the same subgraphs in C++).

    ``weights``: the model is written there and its graph comes back without the weights, which stay in a
    data file of that folder (``weights.py``: models past protobuf's 2 GB).

    ``let_dims_specialize``: dynamo may make a dynamic dim static (``Dim.AUTO``)
    instead of failing; for the diagnosis, which then finds where it happened.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; choose from {EXPORTERS + ('auto',)}")
    if exporter == "dynamo" and not HAS_DYNAMO:
        raise RuntimeError(flags.NO_DYNAMO)
    captured = Captured()
    records: List[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as records, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _quiet_logs():
            warnings.simplefilter("always")
            with patched(**(patch_options or {})):
                if exporter == "torchscript":
                    proto, captured.serialized = _torchscript(model, args, inputs, outputs, opset, fold, weights)
                else:
                    auto = getattr(getattr(torch.export, "Dim", None), "AUTO", None) if let_dims_specialize else None
                    proto = _dynamo(model, args, inputs, outputs, opset, captured, hint=auto, weights=weights)
    except Exception as exc:
        for record in records:
            captured.add(record)
        exc.onnx_compat_warnings = captured  # the report keeps a failed attempt's warnings too
        raise
    for record in records:
        captured.add(record)
    return proto, captured


def bare_export(model: torch.nn.Module, args: Tuple, exporter: str, input_names: Sequence[str],
                dynamic_axes: Dict[str, Dict[int, str]], output_names: Optional[Sequence[str]] = None,
                max_size: Optional[int] = 4096, path: Optional[str] = None) -> Optional[onnx.ModelProto]:
    """Plain ``torch.onnx.export`` to a ModelProto, quietly: what a user's own call does.

    ``path``: written there instead (weights past 2 GB beside it, as the exporter decides); returns None.

    No specs, no checks; the patches are whatever the caller has in place. For the
    tests and benchmarks that compare against (or time) the exporter itself.
    ``dynamic_axes``: ``{input_name: {axis: dim_name}}``; same name, same dim.
    """
    with preserved(model), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), _quiet_logs():
        model.eval()
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = path or io.BytesIO()
            torch.onnx.export(model, tuple(args), buf, input_names=list(input_names), output_names=output_names,
                              dynamic_axes={k: v for k, v in dynamic_axes.items() if v}, **_TORCHSCRIPT)
            return None if path else onnx.load_from_string(buf.getvalue())
        dims: Dict[str, object] = {}
        shapes = tuple({a: dims.setdefault(n, torch.export.Dim(n, min=1, **({"max": max_size} if max_size else {})))
                        for a, n in dynamic_axes.get(name, {}).items()} or None for name in input_names)
        program = torch.onnx.export(model, tuple(args), dynamo=True, dynamic_shapes=shapes,
                                    input_names=list(input_names), output_names=output_names, verbose=False)
        if path:
            program.save(path)
            return None
        return program.model_proto


def _torchscript(model, args, inputs, outputs, opset, fold: bool = True,
                 weights: Optional[WeightsFolder] = None) -> Tuple[onnx.ModelProto, Optional[bytes]]:
    """The exported graph, and its bytes as the exporter wrote them (None when written to ``weights``)."""
    axes = wanted_dynamic(list(inputs) + list(outputs))
    # In memory unless the weights need a file (no file written and read back: 0.1 s on the 12 x 256 Conformer)
    target = io.BytesIO() if weights is None else weights.step_path("torchscript")
    try:
        torch.onnx.export(model, args, target, input_names=_onnx_names(inputs), output_names=_onnx_names(outputs),
                          dynamic_axes={k: v for k, v in axes.items() if v}, opset_version=opset,
                          do_constant_folding=fold, **_TORCHSCRIPT)
    except Exception as exc:
        _attach_failed_scope(exc, model, args)
        raise
    if weights is not None:
        return weights.adopt(target, "torchscript"), None
    data = target.getvalue()
    return onnx.load_from_string(data), data


_FAILED_OP = re.compile(r"operator '(\w+::\w+)'")


def _attach_failed_scope(exc: BaseException, model, args) -> None:
    """An op the TorchScript exporter cannot convert is named, its node is not: trace again (only now,
    on failure, with the same patches acting) and attach the first such node's scope and source."""
    found = _FAILED_OP.search(str(exc))
    if not found or "scope:" in str(exc):  # the error quotes the node's scope itself
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flags.request_trace(+1)
            try:
                traced = torch.jit.trace(model, args, check_trace=False, strict=False)
            finally:
                flags.request_trace(-1)
        node = next((n for n in traced.inlined_graph.nodes() if n.kind() == found.group(1)), None)
    except Exception:  # diagnosis never hides the exporter's own error
        return
    if node is not None:
        exc.onnx_compat_scope = (node.scopeName(), str(node.sourceRange()).splitlines()[0] if node.sourceRange() else "")


# ``Dim.DYNAMIC`` with bounds (torch >= 2.6): a hint, not a named symbol. A named ``torch.export.Dim``
# turns every guard torch.export cannot prove over the declared range into an error (e.g. ``len(x)``
# in non-strict mode, or ``ceil(T/2) != 1`` behind a broadcast), and ``torch.onnx.export`` then retries
# in other modes that quietly make the dim static. A hint lets torch.export narrow the range instead
# and still raises when the dim would become a constant.
_HINT = getattr(getattr(getattr(torch, "export", None), "Dim", None), "DYNAMIC", None)


def _torch_dims(hint=None):
    dims: Dict[str, object] = {}
    hint = hint or _HINT

    def torch_dim(dim: Dim):
        k = dim.multiple
        if k == 1 and callable(hint):
            return hint(min=dim.min, **({"max": dim.max} if dim.max else {}))
        if dim.name not in dims:
            limits = {"min": -(-dim.min // k), **({"max": dim.max // k} if dim.max else {})}
            base = torch.export.Dim(dim.name if k == 1 else f"{dim.name}_div{k}", **limits)
            dims[dim.name] = base if k == 1 else k * base
        return dims[dim.name]
    return torch_dim


# torch.onnx's progress lines (verbose=True, 2.13): one per capture strategy, then its outcome
_STRATEGY = re.compile(r"with `([^`]+)`\.\.\. (\u2705|\u274c)")


def _strategies(text: str) -> List[str]:
    return [f"{how}: {'ok' if mark == chr(0x2705) else 'failed'}" for how, mark in _STRATEGY.findall(text)]


def _dynamo(model, args, inputs, outputs, opset, captured: Optional[Captured] = None,
            hint=None, weights: Optional[WeightsFolder] = None) -> onnx.ModelProto:
    torch_dim = _torch_dims(hint)

    in_axes = _axes(inputs)
    names = _onnx_names(inputs)
    shapes = tuple({a: torch_dim(d) for a, d in in_axes[name].items()} or None for name in names)
    progress = io.StringIO()
    try:
        with contextlib.redirect_stdout(progress):
            program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=(shapes,), opset_version=opset,
                                        input_names=names, output_names=_onnx_names(outputs), verbose=True)
    except Exception as exc:
        static = _static_dims(exc, names, in_axes)
        if static:
            raise DimSpecialized("; ".join(static)) from exc
        _attach_failed_node(exc, model, args, (shapes,))
        raise
    finally:
        if captured is not None:
            captured.capture = _strategies(progress.getvalue())
    if weights is None:
        proto = program.model_proto
    else:  # never the whole proto in memory: written with its weights beside it, read back without them
        written = weights.step_path("dynamo")
        program.save(written, external_data=True)
        proto = weights.adopt(written, "dynamo")
    _restore_input_names(proto, names)
    _name_dims(proto, inputs, outputs)
    return proto


def _restore_input_names(proto: onnx.ModelProto, names: Sequence[str]) -> None:
    """torch 2.8's dynamo exporter names an input that the model returns unchanged (lengths passed
    through) after the output: the input gets its declared name back, the output an Identity of it."""
    taken = {v.name for v in proto.graph.input}
    for value, want in zip(proto.graph.input, names):
        have = value.name
        if have == want or want in taken:
            continue
        value.name = want
        for node in all_nodes(proto):
            for i, name in enumerate(node.input):
                if name == have:
                    node.input[i] = want
        if any(o.name == have for o in proto.graph.output):
            proto.graph.node.insert(0, onnx.helper.make_node("Identity", [want], [have], name=f"{have}_passthrough"))


_FAILED_NODE = re.compile(r"Error when translating node %(\w+)")


def _attach_failed_node(exc: BaseException, model, args, dynamic_shapes) -> None:
    """A translation failure names an FX node of a program torch.onnx does not hand back: export it
    again (only now, on failure) and attach that node's module stack and source for ``culprit``."""
    found = _FAILED_NODE.search(_cause_text(exc))
    if not found:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
            program = program.run_decompositions()
    except Exception:  # diagnosis never hides the exporter's own error
        return
    nodes = {node.name: node for node in program.graph.nodes}
    name = found.group(1)
    node = nodes.get(name) or next((n for key, n in nodes.items() if key.split("_default")[0] == name.rstrip("_0123456789")
                                    or name.startswith(key)), None)
    if node is not None:
        exc.onnx_compat_node = {"nn_module_stack": node.meta.get("nn_module_stack"),
                                "stack_trace": node.meta.get("stack_trace")}


class DimSpecialized(RuntimeError):
    """torch.export found that the model makes a dim asked to be dynamic a constant."""


# torch.export's words for a dynamic-hinted dim the trace made static; the inputs are the adapter's flat
# ``*tensors``, in ONNX order (2.13: ``inputs['tensors'][0].shape[1]``, 2.15: ``inputs[0].shape[1]``)
_STATIC = re.compile(r"inferred a static shape of (\d+) for dimension inputs(?:\['tensors'\])?\[(\d+)\]\.shape\[(\d+)\]")


def _cause_text(exc: BaseException) -> str:
    """The messages of ``exc`` and of every exception it was raised from: exporters wrap the real one."""
    text, seen = "", exc
    while seen is not None:
        text += "\n" + str(seen)
        seen = seen.__cause__
    return text


def _static_dims(exc: BaseException, names: Sequence[str], axes: Dict[str, Dict[int, Dim]]) -> List[str]:
    found = []
    for size, index, axis in _STATIC.findall(_cause_text(exc)):
        name = names[int(index)] if int(index) < len(names) else f"input {index}"
        dim = axes.get(name, {}).get(int(axis))
        label = f" ('{dim.name}')" if dim is not None else ""
        message = f"'{name}' dim {axis}{label} was requested dynamic but is {size} in the traced model"
        if message not in found:
            found.append(message)
    return found


def _name_dims(proto: onnx.ModelProto, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """Give symbolic dims the names the spec declares (dynamo derives its own for
    outputs, and writes ``10*samples_div10`` for a ``Dim(multiple=10)``)."""
    by_name = {v.name: v for v in list(proto.graph.input) + list(proto.graph.output)}
    for name, axes in _axes(list(inputs) + list(outputs)).items():
        value = by_name.get(name)
        if value is None:
            continue
        shape = value.type.tensor_type.shape
        for axis, dim in axes.items():
            if axis < len(shape.dim) and shape.dim[axis].HasField("dim_param"):
                shape.dim[axis].dim_param = dim.name
