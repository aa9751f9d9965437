"""The culprit search ``onnx_compat.export`` hands to the pipeline (``ExportRequest.diagnose``).

The pipeline does not import the diagnosis (the diagnosis exports through the
pipeline's capture): it calls what it is given with a failed attempt's error.
"""
from __future__ import annotations

from typing import Optional

from onnx_compat.diagnosis.culprit import culprit
from onnx_compat.diagnosis.per_module import diagnose
from onnx_compat.errors import Culprit, VerificationError


def culprit_of_failure(exc: BaseException, subject, what: str, *, exporter: str, atol: float, rtol: float,
                       patches: Optional[dict] = None, search_modules: bool = True) -> Optional[Culprit]:
    """The module a failed attempt points at: from the error itself (``culprit``), else, for wrong numbers at
    new shapes and with ``search_modules``, the module where they start (``diagnose`` exports once more, module
    by module)."""
    found = culprit(exc, subject.model, what)
    if found is not None or not isinstance(exc, VerificationError) or not search_modules:
        return found
    try:
        return diagnose(subject, exporter=exporter, atol=atol, rtol=rtol, patches=patches).culprit
    except Exception:  # noqa: BLE001 - the verification error stays the error; the diagnosis only helps
        return None
