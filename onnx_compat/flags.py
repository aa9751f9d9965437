"""Which export, if any, is running right now.

Patches act only while an export traces the model, so eager and training code
never see them. The two exporters raise different flags (measured on torch
2.13): the TorchScript exporter traces (``torch.jit.is_tracing()``), the dynamo
exporter sets ``torch.compiler.is_exporting()``; both set
``torch.onnx.is_in_onnx_export()``. The flags are process-wide. Each check is
feature-gated so torch 2.0, which lacks ``torch.compiler``, works too.

The cheapest check comes first: in eager code every predicate returns after
one C call.
"""
from __future__ import annotations

import inspect
import re
import threading
from typing import Tuple

import torch

_compiler = getattr(torch, "compiler", None)
_is_exporting = getattr(_compiler, "is_exporting", None)
_is_tracing = torch._C._is_tracing if hasattr(torch._C, "_is_tracing") else torch.jit.is_tracing

_lock = threading.Lock()
_trace_requests = 0  # patched(during_trace=True) blocks now open


def dynamo_exporting() -> bool:
    """The dynamo exporter (torch.export) is tracing the model."""
    return _is_exporting is not None and _is_exporting()


def torchscript_exporting() -> bool:
    """The TorchScript exporter is tracing, or a plain ``jit.trace`` when asked for."""
    if not _is_tracing():
        return False
    return _trace_requests > 0 or torch.onnx.is_in_onnx_export()


def any_exporting() -> bool:
    """Either exporter is tracing (or a plain ``jit.trace`` when asked for)."""
    return dynamo_exporting() or torchscript_exporting()


def always() -> bool:
    return True


WHEN = {
    "torchscript": torchscript_exporting,
    "dynamo": dynamo_exporting,
    "export": any_exporting,
    "always": always,
}


def _release(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


TORCH = _release(torch.__version__)


def torch_at_least(version: str) -> bool:
    """This torch is ``version`` or newer (local build tags such as ``+cpu`` ignored)."""
    return TORCH >= _release(version)


EXPORT_PARAMS = inspect.signature(torch.onnx.export).parameters
# torch.onnx.export(dynamo=True, dynamic_shapes=...): the dynamo exporter as onnx_compat uses it, from 2.13 on.
# make test-matrix: 2.4 has dynamo= without dynamic_shapes=; 2.6 has both but bakes dims passed as Dim.DYNAMIC
# hints (127 tests fail); 2.8 fails 33 that 2.13 passes (ISTFT/complex and pad translations, LSTMP capture).
# 2.9-2.12 are not in the matrix; below 2.13 auto is TorchScript alone, which verifies there.
DYNAMO_SINCE = "2.13"
HAS_DYNAMO = "dynamo" in EXPORT_PARAMS and "dynamic_shapes" in EXPORT_PARAMS and torch_at_least(DYNAMO_SINCE)
NO_DYNAMO = f"onnx_compat uses torch's dynamo exporter from torch {DYNAMO_SINCE} on (this is {torch.__version__})"


def request_trace(delta: int) -> None:
    """Count ``patched(during_trace=True)`` blocks; while any is open, ``jit.trace`` counts."""
    global _trace_requests
    with _lock:
        _trace_requests += delta
        if _trace_requests < 0:
            raise RuntimeError("during_trace released more often than requested")
