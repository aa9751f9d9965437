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
from typing import Any, Dict, List, Optional, Tuple


class OnnxCompatError(Exception):
    """The base of every error onnx_compat raises on purpose."""


class SpecError(OnnxCompatError, ValueError):
    """The declared inputs/outputs (or the examples) do not fit the model or each other."""


class TargetError(OnnxCompatError, ValueError):
    """A deployment target that is unknown, or that no exporter can satisfy."""


class SpectralError(OnnxCompatError, RuntimeError):
    """A complex-valued call the spectral patches cannot write as real ops."""


class RuntimeUnavailable(OnnxCompatError, RuntimeError):
    """Another ONNX Runtime asked for (an interpreter, Node.js) cannot be used here."""


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

    def __str__(self) -> str:
        label = f" ('{self.dim}')" if self.dim else ""
        asked = f"up to {self.wanted}" if self.wanted else "at any size"
        return (f"'{self.input}' dim {self.axis}{label} was requested dynamic {asked} but the traced model holds "
                f"only up to {self.high}: Python code made a size a number (int(), math.ceil, max/min of sizes) "
                "and dynamo kept the example's value in the graph")


class DimSpecialized(OnnxCompatError, RuntimeError):
    """torch.export found that the model makes a dim asked to be dynamic a constant."""

    def __init__(self, dims: List[StaticDim]) -> None:
        super().__init__("; ".join(str(d) for d in dims))
        self.dims = list(dims)


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
    kind: str = "values"  # "load", "run", "shape", "length" or "values" (only the tolerance was missed)


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
