"""torch.export's own options for data-dependent values as capture strategies, measured for ``auto``.

Each is a ``Dynamo`` strategy that captures with ``torch.export`` under one option and hands the program to
``torch.onnx.export``. None turned a failure into a verified graph on the sweep (docs/pipeline.md, "More ways
to capture"), so ``capture.FURTHER`` holds none of them; they stay here so ``benchmarks/capture_options.py``
can measure them again on a later torch. Kept apart from ``capture.py``, which holds what ``auto`` runs.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from onnx_compat.patches.loops import declared_maxima
from onnx_compat.pipeline import dims
from onnx_compat.pipeline.capture import Captured, Dynamo, Request


class _Exported(Dynamo):
    """torch.export with one of its options for data-dependent values (``_options``), the program then handed
    to ``torch.onnx.export`` (which takes an ``ExportedProgram``): a further way to capture, tried by ``auto``
    only after every other strategy failed, so it costs nothing where they succeed."""

    how = ""

    def __init__(self) -> None:
        self.label = f"dynamo ({self.how})"

    def _options(self):
        return contextlib.nullcontext()

    def _export(self, request: Request, captured: Captured):
        return torch.export.export(request.model, request.args, dynamic_shapes=self._shapes(request), strict=False)

    def _onnx_program(self, request: Request, captured: Captured):
        with self._options(), declared_maxima(self.maxima(request)):  # as the Dynamo strategy's own capture
            program = self._export(request, captured)
        captured.capture.append(f"torch.export ({self.how}): ok")
        return torch.onnx.export(program, request.args, dynamo=True, opset_version=request.opset,
                                 input_names=dims.onnx_names(request.inputs),
                                 output_names=dims.onnx_names(request.outputs), verbose=True)


class ScalarOutputs(_Exported):
    """``.item()`` and ops whose output size depends on values (``nonzero``) captured as unbacked sizes
    (``torch._dynamo.config``), under torch.export's strict (bytecode) mode, the one these settings reach.
    torch 2.13's torch.export sets both itself there, and ``torch.onnx.export`` tries strict mode already."""

    how = "scalar outputs as unbacked sizes"

    def _options(self):
        return torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)

    def _export(self, request: Request, captured: Captured):
        return torch.export.export(request.model, request.args, dynamic_shapes=self._shapes(request), strict=True)


class SizeOblivious(_Exported):
    """Size-oblivious reasoning for backed sizes (``torch.fx.experimental._config.backed_size_oblivious``):
    a size is taken as >= 2 where a guard would otherwise specialise it to 0 or 1; torch 2.13 also lets a
    view's size-oblivious fallback unify symbols (``unify_view_symbols_bso_meta``) before specialising.
    ``torch.onnx.export``'s own capture sets ``backed_size_oblivious`` on 2.13: only the unification is new."""

    how = "size-oblivious guards"

    def _options(self):
        config = torch.fx.experimental._config
        wanted = {k: True for k in ("backed_size_oblivious", "unify_view_symbols_bso_meta") if hasattr(config, k)}
        return config.patch(**wanted)


class DraftExport(_Exported):
    """``torch.export.draft_export``: where torch.export would stop on a data-dependent value, a guard or an op
    without a fake kernel, it takes the example's real values and goes on, and reports each assumption (into
    ``Captured.assumed``, then the report). The graph is verified at new shapes like any other, which tests its
    assumptions on sizes; one on a value (a branch on a sum's sign) the verification inputs may share with the
    example, and the graph then verifies while wrong for the other branch (``tests/test_capture.py``)."""

    how = "draft export"

    def unavailable(self) -> Optional[str]:
        return super().unavailable() or (None if hasattr(torch.export, "draft_export") else
                                         f"torch {torch.__version__} has no torch.export.draft_export")

    def _export(self, request: Request, captured: Captured):
        program = torch.export.draft_export(request.model, request.args, dynamic_shapes=self._shapes(request))
        report = getattr(program, "_report", None)
        captured.assumed = [_assumption(f, report.str_to_filename) for f in getattr(report, "failures", ())]
        return program


def _assumption(failure, files: dict) -> str:
    """One line for one of draft export's reported failures: what it assumed, and where."""
    data, kind = failure.data, str(failure.failure_type)
    stack = data.get("user_stack") or []
    where = next((f"{files.get(f['filename'], '?')}:{f['line']}" for f in reversed(stack)
                  if f.get("filename") in files), "")
    where = f" at {where}" if where else ""
    if kind == "DATA_DEPENDENT_ERROR":
        return f"data-dependent {data.get('expr')} taken as {data.get('result')} (the example's value){where}"
    if kind == "GUARD_ADDED":
        return f"guard {data.get('expr')} added{where}"
    if kind == "MISSING_FAKE_KERNEL":
        return f"{data.get('op')} has no fake kernel: its output sizes taken from the example"
    return f"{kind}: {data.get('op', '')} {data.get('reason', '')}".strip()


CAPTURE_OPTIONS = (ScalarOutputs(), SizeOblivious(), DraftExport())  # measured; capture.FURTHER keeps those that pay
