"""What one capture said: its warnings sorted by what they mean, its error in one line.

The exporters speak in warnings (a TracerWarning for each Python number a
trace froze, chatter at every export) and in errors wrapped in banners; the
report and the culprit search need both read the same way, whichever capture
strategy (``capture.py``) ran.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from onnx_compat.errors import CaptureError

# TracerWarnings whose cause is a value frozen into the graph.
_BAKED = re.compile(r"Converting a tensor to a Python|Iterating over a tensor|"
                    r"torch\.tensor results are registered as constants|might cause the trace to be incorrect")
# Of those, a traced value made a Python number or bool (a size frozen, a branch on one taken as at the example);
# ``torch.as_tensor`` of constants warns too, and is no such sign.
_CONVERTED = re.compile(r"Converting a tensor to a Python")
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


def froze_a_value(baked: Sequence[str]) -> bool:
    """The trace made a traced value a Python number or bool (``Captured.baked``): its graph may hold near the
    example and fail only past it, so verification looks far from it too (``spec.with_far_sizes``)."""
    return any(_CONVERTED.search(warning) for warning in baked)


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
    # the patches whose wrapper ran during the capture: none, and the capture was the plain export's
    acted: List[str] = field(default_factory=list)
    # draft export: what it assumed where torch.export would have stopped (the example's values, guards); a
    # rewrite of the model's code that takes something for granted (source_rewrites.Rule.assumes)
    assumed: List[str] = field(default_factory=list)
    # dynamo: the lines of chunks of a dynamic dim whose count depends on its size (``fixed_pieces.counted_chunks``),
    # the likely cause when that dim comes out a number
    counted: List[str] = field(default_factory=list)
    # TorchScript: the constant divisors of sizes' remainders its trace computed (``size_remainders.py``), each a
    # verification shape at a multiple of it
    remainders: List[int] = field(default_factory=list)

    def add(self, record: warnings.WarningMessage) -> None:
        text = f"{record.category.__name__}: {str(record.message).splitlines()[0]} ({record.filename}:{record.lineno})"
        if issubclass(record.category, torch.jit.TracerWarning) and _BAKED.search(str(record.message)):
            if text not in self.baked:
                self.baked.append(text)
        elif not _noise(record) and text not in self.other:
            self.other.append(text)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _wrapper_classes() -> Tuple[type, ...]:
    """The exporters' generic errors that wrap the real one (``raise ... from``), where this torch has them."""
    found = [getattr(getattr(torch.onnx, "errors", None), "OnnxExporterError", None)]
    try:
        from torch.onnx._internal.exporter import _errors
        found += [getattr(_errors, "TorchExportError", None), getattr(_errors, "ConversionError", None)]
    except ImportError:
        pass
    return tuple(c for c in found if isinstance(c, type))


_WRAPPERS = _wrapper_classes()


def error_line(exc: BaseException) -> str:
    """The root cause in one line: exporters wrap the real error in a generic one
    whose message starts with a banner; the cause is the ``<class 'X'>: ...`` line."""
    if isinstance(exc, CaptureError):
        return exc.line
    while exc.__cause__ is not None and type(exc) in _WRAPPERS:
        exc = exc.__cause__
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("<class '") and "'>: " in line:
            kind, _, message = line.partition("'>: ")
            return f"{kind[len('<class '):].split('.')[-1]}: {message}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


# torch.onnx's progress lines (verbose=True, 2.13): one per capture strategy, then its outcome
_STRATEGY = re.compile(r"with `([^`]+)`\.\.\. (\u2705|\u274c)")


def progress_strategies(text: str) -> List[str]:
    """Each capture strategy torch.onnx tried, from its progress lines, and how it went."""
    return [f"{how}: {'ok' if mark == chr(0x2705) else 'failed'}" for how, mark in _STRATEGY.findall(text)]


_LOCATION = re.compile(r"\(([^()]+:\d+)\)$")


def baked_hint(baked: Sequence[str]) -> str:
    """Where the tracer turned a tensor into a Python number: the user's source line that baked a size
    (a line of the user's code before one inside torch)."""
    places: List[str] = []
    for text in baked:
        found = _LOCATION.search(text)
        if found and found.group(1) not in places:
            places.append(found.group(1))
    if not places:
        return ""
    places.sort(key=lambda p: os.path.abspath(p).startswith(_TORCH_DIR))
    more = f" and {len(places) - 1} more" if len(places) > 1 else ""
    return (f" [a size was frozen into the graph by Python code at {places[0]}{more} (TracerWarning: "
            "'Converting a tensor to a Python ...'); compute it with tensor ops there, or let the dynamo "
            "exporter trace it]")


def counted_hint(counted: Sequence[str], said: str = "") -> str:
    """The chunks whose count depends on a dynamic size (dynamo: ``Captured.counted``), the likely cause of a
    graph that holds a dim at the example's value or is wrong at other sizes; one the error ``said`` already (a
    refusal of pieces looped over, counted too) is left out."""
    counted = [c for c in dict.fromkeys(counted) if c not in said]
    return f" [likely cause: {'; '.join(counted)}]" if counted else ""
