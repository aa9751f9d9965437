"""Everything onnx_compat raises on purpose, in one hierarchy.

Each error says in its message what a person needs (the output, dim,
argument, state or module at fault) and carries the same facts as fields,
so that code (the pipeline, ``diagnose``, the CLI, a user's script) reads
fields and never parses message text. Each class also derives from the
built-in exception it replaced, so ``except ValueError`` and the like keep
working.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple


class OnnxCompatError(Exception):
    """The base of every error onnx_compat raises on purpose."""


class ArgumentError(OnnxCompatError, ValueError):
    """An argument of a public call that is unknown or out of range; ``argument`` names it, ``value`` is what
    was given (``exporter="bogus"``, ``contract="nope"``, ``quantize=`` without ``verify=True``)."""

    def __init__(self, message: str, *, argument: Optional[str] = None, value: Any = None) -> None:
        super().__init__(message)
        self.argument, self.value = argument, value


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong kind (``runtimes=[42]``, a model that is not a module)."""


class UsageError(OnnxCompatError, ValueError):
    """The command line asks for something it cannot do (exit code 2); ``option`` names the flag at fault."""

    def __init__(self, message: str, *, option: Optional[str] = None) -> None:
        super().__init__(message)
        self.option = option


class FactoryError(UsageError):
    """A ``MODULE:FACTORY`` that cannot be imported or does not return what its verb needs."""


class OutputPathError(OnnxCompatError, ValueError):
    """A file cannot be written where it was asked to be (a directory, no folder, no permission, no room);
    found before any work starts. ``path``: the file asked for."""

    def __init__(self, message: str, *, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path


class WriteError(OnnxCompatError, OSError):
    """Writing a file failed while it was written (the disk filled up); nothing partial is left."""


class ModelFileError(OnnxCompatError, ValueError):
    """An ``.onnx`` file that cannot be read: missing, truncated or not a model. ``path`` names it."""

    def __init__(self, message: str, *, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path


class PatchError(OnnxCompatError, ValueError):
    """A patch name or declaration that does not fit the registry (``patched(only=["nope"])``); ``patch``."""

    def __init__(self, message: str, *, patch: Optional[str] = None) -> None:
        super().__init__(message)
        self.patch = patch


class PatchSelectionTypeError(PatchError, TypeError):
    """``only=``/``exclude=`` given a string, not a list of names."""


class PatchUnavailable(PatchError, RuntimeError):
    """A patch asked for by name that cannot act with this torch or without its library."""


class SpecError(OnnxCompatError, ValueError):
    """The declared inputs/outputs (or the examples) do not fit the model or each other."""


class TargetError(OnnxCompatError, ValueError):
    """A deployment target that is unknown, or that no exporter can satisfy."""


class UnsupportedPattern(OnnxCompatError, NotImplementedError):
    """A patch recognised what the model does and refuses it on purpose, naming the model's line: a Python
    loop over a dynamic size, a computation that leaves torch for numpy. Deliberate, so it is the error a
    user reads first, never mistaken for a patch that broke (``first_cause``)."""


class RewriteAsked(UnsupportedPattern):
    """A form that stops the dynamo capture only for how it is written, refused at ``where`` (the model's
    file:line) in ``function`` (the code's name); the capture answers it by running again with that function's
    source rewritten there (``patches/source_rewrites.py``), and raises it as it is where it cannot be."""

    def __init__(self, message: str, where: str, function: str) -> None:
        super().__init__(message)
        self.where, self.function = where, function


class RangeBoundToName(RewriteAsked):
    """``seq = range(n)`` of a dynamic size, iterated by a later ``for t in seq``: the range is written in the
    ``for`` (``patches/range_names.py``) so that the loop can run as a scan."""


class SizeBranch(RewriteAsked):
    """``if <size condition>: x = F.pad(x, widths)``: the pad is made at every size, by zero where the condition
    is false (``patches/size_branches.py``), not the example's side at every size."""


class EmptySkip(RewriteAsked):
    """``if <data-dependent size> == 0: continue``: the rest of the loop step runs on the empty selection
    (``patches/empty_skips.py``) instead of a guard on a value of the data."""


class GradientInForward(UnsupportedPattern):
    """``torch.autograd.grad`` called by the model's forward (marginals as the gradient of a log partition,
    forces as the gradient of an energy), met by a capture that records no backward pass; dynamo's capture
    answers it by tracing the model again below autograd (``patches/autograd_in_forward.py``)."""


class SpectralError(OnnxCompatError, RuntimeError):
    """A complex-valued call the spectral patches cannot write as real ops."""


class RuntimeUnavailable(OnnxCompatError, RuntimeError):
    """Another ONNX Runtime asked for (an interpreter, Node.js) cannot be used here."""


class DataDependentBranch(OnnxCompatError, RuntimeError):
    """A branch on a tensor's value that is not a check, met while the dynamo exporter traced (``patches/checks``);
    ``where``: the model's file:line, ``cause``: dynamo's own error."""

    def __init__(self, where: str, cause: BaseException, function: str = "") -> None:
        super().__init__(f"{where}: the model branches on a tensor's value here, which the dynamo exporter "
                         f"cannot trace (only checks whose failing branch just raises or reports are dropped, and "
                         f"branches whose body only stores into tensors, t[mask] = v, or only binds names, "
                         f"x = a / else: x = b, are traced as torch.where): "
                         f"{cause}")
        self.where, self.cause, self.function = where, cause, function  # function: the code's name at where


class DrawsDiffer(OnnxCompatError):
    """The model's random draws cannot be fed to the graph's random nodes (``pipeline/draw_inputs``); the message
    says which draw and which node. Verification turns it into a ``VerificationError`` of kind "draws"."""


class EagerMismatch(OnnxCompatError, AssertionError):
    """``onnx_compat.testing``: ONNX Runtime and the eager model disagree (or the reference is degenerate); the
    fields say where. An ``AssertionError`` too, so a test runner reports it as a failed assertion."""

    def __init__(self, message: str, *, case: str, sizes: Dict[str, int], output: Optional[int] = None,
                 max_error: Optional[float] = None, atol: Optional[float] = None, rtol: Optional[float] = None):
        super().__init__(message)
        self.case, self.sizes, self.output = case, dict(sizes), output
        self.max_error, self.atol, self.rtol = max_error, atol, rtol


@dataclass(frozen=True)
class StaticDim:
    """A dim declared dynamic that the traced model makes a constant."""

    input: str
    axis: int
    dim: Optional[str]  # the Dim's name, when the input declares one there
    size: int

    def __str__(self) -> str:
        label = f" ('{self.dim}')" if self.dim else ""
        return f"'{self.input}' dim {self.axis}{label} was requested dynamic but is {self.size} in the traced model"


@dataclass
class NarrowedDim:
    """A dim declared dynamic that the traced model is valid for only up to ``high`` (dynamo turned a guard on
    a size into a bound: ``int(math.ceil(T / hop))``, ``max(1, n)`` of sizes made Python numbers)."""

    input: str
    axis: int
    dim: Optional[str]
    high: int
    wanted: Optional[int]  # the declared maximum; None: any size
    cause: Optional[str] = None  # what in the model holds ``high`` rows (a cache, a table), when something does

    def __str__(self) -> str:
        label = f" ('{self.dim}')" if self.dim else ""
        asked = f"up to {self.wanted}" if self.wanted else "at any size"
        why = self.cause or ("Python code made a size a number (int(), math.ceil, max/min of sizes) and dynamo kept "
                             "the example's value in the graph")
        return f"'{self.input}' dim {self.axis}{label} was requested dynamic {asked} but the traced model holds " \
               f"only up to {self.high}: {why}"


class DimSpecialized(OnnxCompatError, RuntimeError):
    """torch.export found that the model makes a dim asked to be dynamic a constant."""

    def __init__(self, dims: List[StaticDim]) -> None:
        super().__init__("; ".join(str(d) for d in dims))
        self.dims = list(dims)


class SizedTrace(OnnxCompatError, RuntimeError):
    """TorchScript's trace holds ops that depend on the example's sizes (a loop unrolled at its count), found
    by tracing again at another size (``pipeline/sized_trace.py``). ``lines``: where Python code took a size as
    a number."""

    def __init__(self, message: str, lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.lines = list(lines)


@dataclass
class Culprit:
    """The user's module a failure points at: ``culprit <path> (<Class>): <what> [<file:line>]``."""

    kind: str  # "export", "numbers", "static dim" or "run"
    module: str  # dotted path from named_modules(); "" is the model itself
    cls: str
    detail: str
    where: str = ""  # the source line, file:line

    def line(self) -> str:
        return (f"culprit {self.module or '(the model itself)'} ({self.cls}): {self.detail}"
                + (f" [{self.where}]" if self.where else ""))


class CaptureError(OnnxCompatError, RuntimeError):
    """One exporter failed to produce a graph. Raised from the exporter's own error, which stays the
    ``__cause__`` (with its traceback, where the culprit frame is found).

    ``line``: the root cause in one line. ``warnings``: what was raised while tracing (a
    ``capture.Captured``). ``scope``: TorchScript's ``(scope name, source line)`` of the node it could
    not convert; ``node``: dynamo's ``{"nn_module_stack", "stack_trace"}`` of the node it could not
    translate. Either is found again after the failure, for ``culprit``.
    """

    def __init__(self, exporter: str, line: str, warnings: Any = None, scope: Optional[Tuple[str, str]] = None,
                 node: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(f"{exporter} export failed: {line}")
        self.exporter, self.line, self.warnings, self.scope, self.node = exporter, line, warnings, scope, node


@dataclass
class Mismatch:
    """One verification check that failed: where, and how."""

    sizes: Dict[str, int]
    reason: str  # what a person reads: "output 'y' max abs err 0.3 (atol ..., rtol ...)"
    runtime: Optional[str] = None
    example: bool = False
    outputs: List[str] = field(default_factory=list)  # outputs off by more than the tolerance
    max_abs_err: Optional[float] = None
    kind: str = "values"  # "load", "run", "shape", "length", "draws" (eager's draws do not fit the graph's random nodes) or "values" (only the tolerance was missed)


class VerificationError(OnnxCompatError, AssertionError):
    """ONNX Runtime disagrees with eager PyTorch (or cannot load/run the model)."""

    def __init__(self, message: str, mismatch: Optional[Mismatch] = None) -> None:
        super().__init__(message)
        self.mismatch = mismatch

    @property
    def sizes(self) -> Optional[Dict[str, int]]:
        return self.mismatch.sizes if self.mismatch else None

    @property
    def tolerance_only(self) -> bool:
        """Every shape and length agreed; only values were off by more than the tolerance."""
        return self.mismatch is not None and self.mismatch.kind == "values"


class RandomOutputs(OnnxCompatError, ValueError):
    """The model's outputs change from one call to the next on the same inputs: it draws random numbers
    (noise for a GAN vocoder, a random message) that no export can reproduce, so no graph can be verified
    against it. ``sites``: where the draws happen (file:line and the call), as far as they were found."""

    def __init__(self, message: str, *, sites: Optional[List[str]] = None) -> None:
        super().__init__(message)
        self.sites = list(sites or [])


class ExportError(OnnxCompatError, RuntimeError):
    """No exporter produced a model that passed every check.

    ``attempts``: the report's ``Attempt`` of each exporter tried; ``culprits``: the module each
    failed attempt points at, where one was found; ``stage``: where the last attempt stopped
    ("capture", "dims", "verify", "cleanup", "strict", "rasr", "opset").
    """

    def __init__(self, message: str, *, attempts: Optional[list] = None, culprits: Optional[List[Culprit]] = None,
                 stage: Optional[str] = None) -> None:
        super().__init__(message)
        self.attempts = list(attempts or [])
        self.culprits = list(culprits or [])
        self.stage = stage


# Errors defined beside the layer that raises them, importable from here too. They load on first use: importing
# ``onnx_compat.errors`` must not load streaming, quantization, the consumers or transformers' support.
_ELSEWHERE = {
    **{name: "onnx_compat.huggingface.errors" for name in ("HFError", "ConfigError", "UncoveredModelError",
                                                            "TaskError", "PreprocessorError", "WeightsError")},
    **{name: "onnx_compat.streaming.errors" for name in ("StreamingError", "StreamMismatch", "StreamDrift",
                                                          "NotStreamable")},
    "GraphContractError": "onnx_compat.parts.errors",
    **{name: "onnx_compat.label_scorers.errors" for name in ("LabelScorerError", "DecodeMismatch")},
    "FolderError": "onnx_compat.huggingface.errors",
    "StepError": "onnx_compat.pipeline.steps",
    "QuantizationError": "onnx_compat.quantization.errors",
    "ContractError": "onnx_compat.contracts.base",
    "ConsumerMismatch": "onnx_compat.contracts.consumers",
    "IntRangeError": "onnx_compat.int_ranges",
}

__all__ = ["OnnxCompatError", "ArgumentError", "ArgumentTypeError", "UsageError", "FactoryError", "OutputPathError",
           "WriteError", "ModelFileError", "PatchError", "PatchSelectionTypeError", "PatchUnavailable", "SpecError",
           "TargetError", "SpectralError", "RuntimeUnavailable", "DataDependentBranch", "DrawsDiffer", "EagerMismatch",
           "StaticDim", "NarrowedDim", "DimSpecialized",
           "Culprit", "CaptureError", "Mismatch", "VerificationError", "RandomOutputs", "ExportError", *_ELSEWHERE]


def __getattr__(name: str):
    if name in _ELSEWHERE:
        import importlib
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'onnx_compat.errors' has no attribute {name!r}")


def raised_from(exc: BaseException, kind):
    """``exc`` or the first exception of type ``kind`` it was raised from (``__cause__``, else ``__context__``),
    else None: the exporters wrap the error that says what happened in errors of their own."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised because of Ctrl-C: an exporter that catches every exception may wrap the
    ``KeyboardInterrupt`` in its own error, which must stop the export, never count as a failed attempt."""
    return raised_from(exc, KeyboardInterrupt) is not None


def reraise_interrupt(exc: BaseException) -> None:
    """Raise ``KeyboardInterrupt`` (from ``exc``) when ``exc`` came from one; else nothing."""
    if interrupted(exc):
        raise KeyboardInterrupt() from exc


class NotLiftable(OnnxCompatError):
    """Why a Python loop over a dynamic dim is not run as a scan (``patches.scan_loops``); caught there and said in
    the loop's line-naming refusal, so a user meets it only as that refusal's reason."""


class CarryChanges(NotLiftable):
    """A lifted loop's step gives a state of another shape or dtype than it was given: no scan carries it as it
    is (``patches/scan_loops.lift`` runs the first step before the scan; uncaught, a refusal saying so)."""


class StateOnModules(NotLiftable):
    """A lifted loop's step assigns a tensor to a module's attribute (a neuron's ``self.mem``): a scan step may
    change nothing outside itself (``patches/scan_traces.scanned_steps`` carries such state where torch lets a
    step do so, ``patches/module_state.py``; uncaught, a refusal naming the assignment)."""
