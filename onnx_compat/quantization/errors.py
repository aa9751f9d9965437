"""The one error of quantization, carrying what failed as fields."""
from __future__ import annotations

from typing import Optional


class QuantizationError(ValueError):
    """A quantized model was not written: bad input, or a measure below its threshold.

    Fields: ``recipe`` asked for, and when a measure failed: its ``measure`` name,
    the value it ``got`` (worst over the checked shapes), its ``threshold`` and
    the ``output`` it was measured on. The float model is untouched either way.
    """

    def __init__(self, message: str, *, recipe: Optional[str] = None, measure: Optional[str] = None,
                 got: Optional[float] = None, threshold: Optional[float] = None, output: Optional[str] = None):
        super().__init__(message)
        self.recipe, self.measure, self.got, self.threshold, self.output = recipe, measure, got, threshold, output
