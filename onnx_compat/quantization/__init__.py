"""Smaller models (int8, float16) of a proven float export, verified with measures that fit them.

``quantize(onnx_path, model, inputs, outputs, recipe=..., report=...)`` for a
model already exported; ``finish_export`` is the end of
``export(..., quantize=...)``; ``cli`` holds ``onnx-compat quantize``;
``verify_quantized(path, model, inputs, outputs)`` re-checks a written file with
the measures it records.
"""
from .api import check_request, finish_export, float_path_for, quantize
from .errors import QuantizationError, QuantizationWarning
from .measures import DEFAULT as DEFAULT_MEASURES, MEASURES
from .recipes import NAMES as RECIPE_NAMES, RECIPES
from .report import QuantReport
from .verify_approx import verify_quantized

__all__ = ["quantize", "finish_export", "check_request", "float_path_for", "QuantizationError", "QuantizationWarning", "QuantReport",
           "RECIPES", "RECIPE_NAMES", "MEASURES", "DEFAULT_MEASURES", "MEASURE_NAMES", "verify_quantized"]

MEASURE_NAMES = tuple(m.name for m in MEASURES)  # for the CLI's help: snr, cosine, top1, ctc (ctc:blank=K)
