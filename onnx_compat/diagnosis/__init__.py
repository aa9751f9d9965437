"""Which of the user's modules is at fault, and why: ``diagnose`` and ``culprit``.

``culprit`` reads a failed export (``CaptureError``'s fields and the
traceback); ``diagnose`` exports once more and compares every module's
output in ONNX Runtime with eager. Both answer with ``errors.Culprit``
objects; ``scopes`` maps an exporter's names to the user's module paths.
"""
from onnx_compat.diagnosis.culprit import culprit
from onnx_compat.diagnosis.per_module import Diagnosis, Finding, diagnose, module_values

__all__ = ["Diagnosis", "Finding", "culprit", "diagnose", "module_values"]
