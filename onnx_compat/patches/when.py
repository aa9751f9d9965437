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

import threading
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


def request_trace(delta: int) -> None:
    """Count ``patched(during_trace=True)`` blocks; while any is open, ``jit.trace`` counts."""
    global _trace_requests
    with _lock:
        _trace_requests += delta
        if _trace_requests < 0:
            raise RuntimeError("during_trace released more often than requested")
