"""A deliberate refusal ends the dynamo capture: torch.onnx's strict retry of the same model is not run.

``torch.onnx.export(dynamo=True)`` captures with ``torch.export(strict=False)`` and, when that raises, tries
again with ``strict=True`` (dynamo's bytecode tracer). A patch that refuses a model on purpose
(``UnsupportedPattern``: a Python loop over a dynamic size, ``math.log2(T)`` freezing a trip count) raises
in the first attempt, naming the model's line; the strict attempt then traces the whole model again
without the patches' view of it, and reaches the same dead end later and slower, or never: a log2(T)
parallel scan (mambapy's ``pscan.py``: ``2 ** ceil(log2(T))`` padding, then a loop of halving views)
keeps ``L`` symbolic there and builds nested ``L//2//2...`` view checks whose simplification ran over
300 s (sweep round three), where the refusal had come after seconds. A small model of the same shape took
31 s with the retry, against 2-3 s to the refusal without it.

While patched, a refusal raised by the non-strict attempt is raised again in place of the strict attempt;
torch.onnx then reports it as the capture's error, as before, only without the retry's time.

The non-strict attempt is also where a branch on a tensor's value stops the capture (``checks.py`` raises
``DataDependentBranch`` at the model's line): one whose sides only bind names is captured again with that
``if`` as ``torch.where`` of both sides, and a ``range`` of a dynamic size bound to a name before its ``for``
is captured again with the range written in the ``for`` (``source_rewrites.captured``, the rules in ``REWRITES``),
and a model whose forward calls ``torch.autograd.grad`` is captured again below autograd, where its backward
pass is recorded (``autograd_in_forward``): this wrapper is the one hook on torch.onnx's non-strict capture.
"""
from __future__ import annotations

import threading

from onnx_compat.errors import GradientInForward, UnsupportedPattern, raised_from
from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register

from . import autograd_in_forward, empty_skips, range_names, size_branches, source_rewrites, value_branches

# what the non-strict capture answers by running again with the model's function rewritten at the line it names
REWRITES = (value_branches.RULE, range_names.RULE, size_branches.RULE, empty_skips.RULE)

_NAME = "refusals_end_capture"
_STRATEGIES = "torch.onnx._internal.exporter._capture_strategies"
_NON_STRICT = f"{_STRATEGIES}:TorchExportNonStrictStrategy._capture"
_STRICT = f"{_STRATEGIES}:TorchExportStrictStrategy._capture"
_last = threading.local()  # the refusal of this thread's last non-strict capture, or None


def refusal_in(exc: BaseException):
    """``exc`` or the exception it was raised from, when that is a deliberate refusal; else None."""
    return raised_from(exc, UnsupportedPattern)


def _capture(wrapped, instance, args, kwargs):
    strict = type(instance).__name__ == "TorchExportStrictStrategy"
    if strict:
        refusal, _last.refusal = getattr(_last, "refusal", None), None
        if refusal is not None:
            raise refusal
        idle(_NAME)
        return wrapped(*args, **kwargs)
    _last.refusal, below = None, []
    try:  # a branch on a tensor's value whose sides only bind names is traced as torch.where of both sides
        result, taken = source_rewrites.captured(lambda: _non_strict(wrapped, args, kwargs, below), REWRITES)
    except Exception as exc:
        _last.refusal = refusal_in(exc)
        idle(_NAME)
        raise
    if not taken and not below:
        idle(_NAME)
    return result


def _non_strict(wrapped, args, kwargs, below: list):
    """torch.onnx's non-strict capture; a model that calls ``torch.autograd.grad`` is captured again below
    autograd (told to ``below``; the rewrites of ``REWRITES`` still apply: this runs inside
    ``source_rewrites.captured``)."""
    try:
        return wrapped(*args, **kwargs)
    except Exception as exc:
        if raised_from(exc, GradientInForward) is None:
            raise
        model, model_args, model_kwargs, dynamic_shapes = _capture_arguments(*args, **kwargs)
        program = autograd_in_forward.captured_with_backward(model, model_args, model_kwargs, dynamic_shapes)
        if program is None:
            raise
        below.append(exc)
        return program


def _capture_arguments(model, args, kwargs, dynamic_shapes):
    """The arguments of torch.onnx's ``_capture(model, args, kwargs, dynamic_shapes)``, however it was called."""
    return model, args, kwargs, dynamic_shapes


register(Patch(
    name=_NAME,
    description="a deliberate refusal (UnsupportedPattern) raised in torch.onnx's non-strict capture is the "
                "capture's error: the strict retry, which re-traces the model without the patches (over 300 s "
                "on a log2(T) parallel scan), is not run; a branch on a tensor's value whose sides only bind names "
                "is captured again as torch.where of both sides",
    targets=(_NON_STRICT, _STRICT),
    on_import=(_NON_STRICT, _STRICT),  # torch.onnx's exporter modules are not loaded by a TorchScript export
    wrapper=_capture,
    when="always",  # the strategies run before torch.export says it is exporting; installed only while patched
    aliases=False,
    min_torch="2.6",
))
