"""Capture: run one exporter on a model whose I/O is already flat (``adapter.py``).

The exporters are strategies (``STRATEGIES``), each a small object whose
``capture`` returns the graph, as torch's own exporter tries its capture
strategies in turn: ``exporter="auto"`` is an iteration over ``AUTO`` (the
exporters under the patches, then each without them, assembled in one place).
Every exporter runs under ``patched()`` (its ``Unpatched`` form under none)
with the warnings it raises captured for the report instead of printed. A
failure is one ``CaptureError`` raised from the exporter's own error, carrying
its warnings and where it happened.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import onnx
import torch

from onnx_compat import versions
from onnx_compat.errors import (ArgumentError, CaptureError, DimSpecialized, SizedTrace, TargetError,
                                reraise_interrupt)
from onnx_compat.graph import all_nodes
from onnx_compat.patches import diagonals, source_rewrites
from onnx_compat.patches.fixed_pieces import counted_chunks
from onnx_compat.patches.length_caches import cache_limits
from onnx_compat.patches.loops import declared_maxima
from onnx_compat.patches.patch import acting
from onnx_compat.patches.registry import patched
from onnx_compat.pipeline import dims, failure_site, size_remainders, sized_trace
from onnx_compat.pipeline.capture_said import Captured, error_line, progress_strategies
from onnx_compat.pipeline.strategy_wrappers import Unpatched, WholeChunks
from onnx_compat.pipeline import weights as weights_module
from onnx_compat.pipeline.weights import WeightsFolder
from onnx_compat.spec import TensorSpec

EXPORT_PARAMS = versions.EXPORT_PARAMS
HAS_DYNAMO = versions.HAS_DYNAMO
_TORCHSCRIPT = {"dynamo": False} if "dynamo" in EXPORT_PARAMS else {}  # torch.onnx.export's flag for it

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


@dataclass
class Request:
    """What one capture needs: the flat model, its example, its specs, and how to export."""

    model: torch.nn.Module
    args: Tuple[torch.Tensor, ...]
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    opset: Optional[int] = None
    weights: Optional[WeightsFolder] = None  # the graph comes back without weights, which stay in a file there
    let_dims_specialize: bool = False  # dynamo: Dim.AUTO, for the diagnosis to find where a dim became static


class TorchScript:
    """``torch.onnx.export(dynamo=False)``: traces with ``torch.jit``; fast, but bakes Python numbers."""

    name = label = "torchscript"  # ``name``: the exporter; ``label``: this way of capturing with it
    patches = True

    def __init__(self, sized_first: bool = False) -> None:
        # auto's first attempt: a trace that depends on the example's sizes stops before its conversion and
        # dynamo goes first (``sized_trace.py``); where there is no dynamo, nothing would go first
        self.sized_first = sized_first and HAS_DYNAMO

    def unavailable(self) -> Optional[str]:
        return None

    def capture(self, request: Request, captured: Captured) -> onnx.ModelProto:
        if request.weights is not None and _graph_module() is not None:
            return self._graph_then_weights(request, captured)
        # In memory unless the weights need a file (no file written and read back: 0.1 s on the 12 x 256 Conformer)
        target = io.BytesIO() if request.weights is None else request.weights.step_path(self.name)
        self._export(request, target, True, captured)
        if request.weights is not None:
            return request.weights.adopt(target, self.name)
        captured.serialized = target.getvalue()
        return onnx.load_from_string(captured.serialized)

    def _graph_then_weights(self, request: Request, captured: Captured) -> onnx.ModelProto:
        """The graph without its weights (``export_params=False``), whose weight inputs then take the tensors
        the exporter would have written, straight into the weights' file. Below 2 GB torch encodes every weight
        into its proto, serialises it and copies the bytes into Python: 3x the weights at once (97 M params)."""
        target = io.BytesIO()
        with _tensors_of_the_graph() as tensors:
            self._export(request, target, False, captured)
        untyped = sorted(n for n, t in tensors.items() if weights_module.onnx_type(t) is None)
        if untyped:
            raise TypeError(f"weights {untyped[:3]} have a dtype ONNX has no type for")
        proto = onnx.load_from_string(target.getvalue())
        return request.weights.take(proto, tensors, self.name)

    def _export(self, request: Request, target, export_params: bool, captured: Captured) -> None:
        axes = dims.wanted_dynamic(list(request.inputs) + list(request.outputs))
        module = _graph_module()
        checked = sized_trace.checked(module, request.model, request.args, request.inputs) \
            if self.sized_first and module is not None else contextlib.nullcontext()
        remainders = size_remainders.recorded(module, captured.remainders) if module is not None \
            else contextlib.nullcontext()
        with _onnx_log_kept_from_stderr(), remainders, checked:
            torch.onnx.export(request.model, request.args, target, input_names=dims.onnx_names(request.inputs),
                              output_names=dims.onnx_names(request.outputs),
                              dynamic_axes={k: v for k, v in axes.items() if v}, opset_version=request.opset,
                              do_constant_folding=True, export_params=export_params, **_TORCHSCRIPT)

    def locate(self, exc: BaseException, request: Request) -> dict:
        return {"scope": failure_site.torchscript_scope(exc, request.model, request.args)}


@contextlib.contextmanager
def _onnx_log_kept_from_stderr():
    """The TorchScript exporter's own log off stderr. torch 2.13's ``setup_onnx_logging`` tests the function
    ``_C._jit_is_onnx_log_enabled`` instead of calling it, so the log is switched on by every export and
    never off: a failed attempt then dumps its whole IR graph ("Torch IR graph at exception: ...", hundreds
    of lines) during auto's fallback, although the error already says what failed. Its Python calls go
    nowhere here and the switch is put back as it was."""
    c = torch._C
    log, enabled = getattr(c, "_jit_onnx_log", None), getattr(c, "_jit_is_onnx_log_enabled", None)
    if log is None or enabled is None:
        yield
        return
    was = bool(enabled())
    c._jit_onnx_log = lambda *args: None
    try:
        yield
    finally:
        c._jit_onnx_log = log
        c._jit_set_onnx_log_enabled(was)


def _graph_module():
    """The module of torch's TorchScript exporter whose ``_model_to_graph`` gives the graph and its weights
    by name (torch 2.9 moved it), or None where it is not found: the exporter then writes the weights itself."""
    for name in ("torch.onnx._internal.torchscript_exporter.utils", "torch.onnx.utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "_model_to_graph", None)) and callable(getattr(module, "_export", None)):
            return module
    return None


@contextlib.contextmanager
def _tensors_of_the_graph():
    """While it is open, the TorchScript exporter's weights by their names in the graph (its parameters,
    buffers and folded constants), as ``_model_to_graph`` hands them to the ONNX encoder."""
    module, found = _graph_module(), {}
    original = module._model_to_graph

    def recording(*args, **kwargs):
        graph, params, out = original(*args, **kwargs)
        found.update(params)
        return graph, params, out
    module._model_to_graph = recording
    try:
        yield found
    finally:
        module._model_to_graph = original


class Dynamo:
    """``torch.onnx.export(dynamo=True)``: torch.export, then translation; symbolic sizes, slower."""

    name = label = "dynamo"
    patches = True

    def unavailable(self) -> Optional[str]:
        return None if HAS_DYNAMO else versions.NO_DYNAMO

    def _shapes(self, request: Request):
        auto = getattr(getattr(torch.export, "Dim", None), "AUTO", None) if request.let_dims_specialize else None
        torch_dim = dims.torch_dims(auto)
        in_axes = dims.axes_of(request.inputs)
        return (tuple({a: torch_dim(d) for a, d in in_axes[name].items()} or None
                      for name in dims.onnx_names(request.inputs)),)

    def capture(self, request: Request, captured: Captured) -> onnx.ModelProto:
        names = dims.onnx_names(request.inputs)
        progress = io.StringIO()
        try:
            with contextlib.redirect_stdout(progress), counted_chunks(captured.counted):
                program = self._onnx_program(request, captured)
        except Exception as exc:
            static = dims.static_dims(exc, names, dims.axes_of(request.inputs))
            if static:
                raise DimSpecialized(static) from exc
            raise
        finally:
            captured.capture = progress_strategies(progress.getvalue())
        exported = getattr(program, "exported_program", None)
        narrowed = [] if exported is None or request.let_dims_specialize else \
            dims.narrowed_dims(exported, names, dims.axes_of(request.inputs), request.args)
        if narrowed:
            for dim in narrowed:  # a table the model holds with that many rows is the likely cause (issue #47, 1)
                dim.cause = cache_limits(request.model, dim.high) or None
            raise DimSpecialized(narrowed)
        if request.weights is None:
            proto = program.model_proto
        else:  # never the whole proto in memory: written with its weights beside it, read back without them
            written = request.weights.step_path(self.name)
            program.save(written, external_data=True)
            proto = request.weights.adopt(written, self.name)
        _restore_input_names(proto, names)
        dims.name_dims(proto, request.inputs, request.outputs)
        return proto

    def _onnx_program(self, request: Request, captured: Captured):
        """torch.onnx's own capture (torch.export non-strict, then strict) and translation; the declared maxima
        told to the patches that read them (``loops.declared_maxima``: torch's bounded hints are checked after
        the trace)."""
        names = dims.onnx_names(request.inputs)
        with declared_maxima(self.maxima(request)):
            return torch.onnx.export(request.model, request.args, dynamo=True, dynamic_shapes=self._shapes(request),
                                     opset_version=request.opset, input_names=names,
                                     output_names=dims.onnx_names(request.outputs), verbose=True)

    def locate(self, exc: BaseException, request: Request) -> dict:
        return {"node": failure_site.dynamo_node(exc, request.model, request.args, self._shapes(request))}

    @staticmethod
    def maxima(request: Request) -> dict:
        """The declared maxima, by (input's position, axis), as ``loops.declared_maxima`` takes them."""
        axes = dims.axes_of(request.inputs)
        return {(i, axis): d.max for i, name in enumerate(dims.onnx_names(request.inputs))
                for axis, d in axes[name].items() if d.max}


# The exporters, in the order ``auto`` tries them. TorchScript first: it exports in a tenth to a fiftieth of dynamo's time
# (0.4 s for a tiny wav2vec2 CTC against the 7-9 s of dynamo export measured on such models), and verification, not the exporter, is what proves a
# graph; dynamo's graphs ran 0.73x-1.34x TorchScript's time in ONNX Runtime with no side winning
# (docs/benchmarks.md), and where an op is known slow in TorchScript's form (an ONNX Loop) ``choose`` exports
# with dynamo too and keeps the faster. dynamo is the fallback where TorchScript fails or does not verify.
STRATEGIES = (TorchScript(), Dynamo())
EXPORTERS = tuple(s.name for s in STRATEGIES)
# auto's TorchScript: a trace sized by the example hands over to dynamo before it is converted, and comes back
# in full (``STRATEGIES[0]``) only if dynamo does not verify (``sized_trace.py``)
SIZED_FIRST = (TorchScript(sized_first=True),) + STRATEGIES[1:]
# ``auto``'s whole order, assembled here: both exporters under the patches, then each without them. Unpatched
# after both patched attempts, not each right after its own: on round one's sweep (docs/sweep.json, 73 models)
# no unpatched export verified a model the patched ones had not, and TorchScript unpatched tried second would
# have added its time on each model patched dynamo then verified (992 s against 975 s for the 73); so an
# unpatched retry costs only where every patched attempt failed.
# Then torch.export's own options for data-dependent values (``FURTHER``): only those that turned a failure
# into a verified graph on some model are kept (docs/pipeline.md, "More ways to capture").
FURTHER = ()  # of capture_options.CAPTURE_OPTIONS, none paid: docs/pipeline.md, "More ways to capture"
# A loop over pieces whose count depends on a length, which stopped patched dynamo, as one step where that only
# saved memory (``WholeChunks``): after both patched exporters, before the unpatched ones (which stop there too).
AUTO = SIZED_FIRST + (WholeChunks(STRATEGIES[1]),) + tuple(Unpatched(s) for s in STRATEGIES) + FURTHER


def strategy(name: str):
    """The capture strategy called ``name``; an unknown name is an ``ArgumentError`` listing the known ones."""
    for s in STRATEGIES:
        if s.name == name:
            return s
    raise ArgumentError(f"unknown exporter {name!r}; choose from {EXPORTERS + ('auto',)}", argument="exporter",
                        value=name)


def strategies_for(choice: str) -> Tuple:
    """``auto``: every strategy this torch can use, in order; else the one named, then it without the patches."""
    if choice == "auto":
        return tuple(s for s in AUTO if s.unavailable() is None)
    return tuple(s for s in AUTO if s.name == strategy(choice).name)


def run(exporter, model: torch.nn.Module, args: Tuple[torch.Tensor, ...], inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec], opset: Optional[int] = None,
        patch_options: Optional[dict] = None, let_dims_specialize: bool = False,
        weights: Optional[WeightsFolder] = None) -> Tuple[onnx.ModelProto, Captured]:
    """Export ``model(*args)`` with ``exporter`` (a name, or a strategy of ``AUTO``) under the patches; the
    graph and what was captured.

    The TorchScript exporter always folds constants itself: it folds the weights' transposes and slices as
    it writes them (torch 2.13: no slower than without), where ONNX Runtime's cleanup would spend 0.05 s on
    them (12 x 256 Conformer, MHA encoder). ``weights``: models past protobuf's 2 GB
    (``weights.py``). ``let_dims_specialize``: dynamo may make a dynamic dim static (``Dim.AUTO``)
    instead of failing, for the diagnosis. A strategy without the patches (``Unpatched``) runs under none,
    whatever ``patch_options`` say. A failure is a ``CaptureError`` (fields: the exporter,
    the one-line cause, the warnings, where it happened) raised from the exporter's own error.
    """
    chosen = strategy(exporter) if isinstance(exporter, str) else exporter
    why_not = chosen.unavailable()
    if why_not:
        raise TargetError(why_not)
    request = Request(model, tuple(args), inputs, outputs, opset, weights, let_dims_specialize)
    captured = Captured()
    options = (patch_options or {}) if chosen.patches else {"only": []}
    records: List[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as records, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _quiet_logs():
            warnings.simplefilter("always")
            with patched(**options), acting() as acted:
                try:
                    # a write into a diagonal read as a copy is refused; torch.onnx.export's own wrapper
                    # (onnx_translations) does it for plain patched() use, but exists only from torch 2.13
                    with diagonals.copies_watched(), source_rewrites.recorded() as assumed:
                        try:
                            proto = chosen.capture(request, captured)
                        finally:  # what a rewrite of the model's code took for granted (empty_skips.py)
                            captured.assumed += assumed
                except Exception as exc:  # located while the same patches act
                    reraise_interrupt(exc)  # Ctrl-C wrapped in an exporter's error stops the export
                    where = {} if isinstance(exc, SizedTrace) else chosen.locate(exc, request)
                    raise CaptureError(chosen.name, error_line(exc), captured, **where) from exc
                finally:
                    captured.acted = sorted(acted)
    finally:
        for record in records:
            captured.add(record)
    return proto, captured


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
