"""The one error of quantization, carrying what failed as fields."""
from __future__ import annotations

from typing import Optional, Sequence

from onnx_compat.errors import OnnxCompatError


class QuantizationError(OnnxCompatError, ValueError):
    """A quantized model was not written: bad input, or a measure below its threshold.

    Fields: ``recipe`` asked for, and when a measure failed: its ``measure`` name,
    the value it ``got`` (worst over the checked shapes), its ``threshold`` and
    the ``output`` it was measured on; ``excluded``: the nodes automatic exclusion
    tried before giving up. The float model is untouched either way.
    """

    def __init__(self, message: str, *, recipe: Optional[str] = None, measure: Optional[str] = None,
                 got: Optional[float] = None, threshold: Optional[float] = None, output: Optional[str] = None,
                 excluded: Sequence[str] = ()):
        super().__init__(message)
        self.recipe, self.measure, self.got, self.threshold, self.output = recipe, measure, got, threshold, output
        self.excluded = list(excluded)


class QuantizationWarning(UserWarning):
    """A quantized model was written, but it is slower than the float one here, or most of its weights stayed
    float32 (``QuantReport.warnings`` keeps the text)."""
