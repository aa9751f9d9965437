"""What a static recipe is calibrated on: the user's examples, or generated inputs (the report says which)."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from ..spec import SpecError, TensorSpec, check_examples, dim_sizes, make_inputs
from .errors import QuantizationError

GENERATED = 8  # inputs drawn when no examples are given
SEED = 1000  # far from verification's seeds, so calibration never sees a verified input


class FeedsReader(CalibrationDataReader):
    """ONNX Runtime's calibration protocol over a list of feeds (re-readable: each recipe run rewinds)."""

    def __init__(self, feeds: Sequence[Dict[str, np.ndarray]]):
        self.feeds, self.position = list(feeds), 0

    def get_next(self):
        if self.position >= len(self.feeds):
            return None
        self.position += 1
        return self.feeds[self.position - 1]

    def __len__(self) -> int:
        return len(self.feeds)

    def rewind(self) -> "FeedsReader":
        self.position = 0
        return self


def calibration_feeds(inputs: Sequence[TensorSpec], examples, recipe: str) -> Tuple[List[Dict[str, np.ndarray]], str]:
    """``(feeds, description)``: the examples checked against the specs, else ``GENERATED`` generated inputs."""
    try:
        checked = check_examples(inputs, examples)
    except SpecError as exc:
        raise QuantizationError(f"calibration examples: {exc}", recipe=recipe) from exc
    if checked:
        feeds = [{k: v.numpy() for k, v in example.items()} for example in checked]
        return feeds, f"{len(feeds)} user example(s)"
    sizes = dim_sizes(inputs)
    feeds = [{k: v.numpy() for k, v in make_inputs(inputs, sizes, seed=SEED + k).items()} for k in range(GENERATED)]
    return feeds, f"{GENERATED} generated inputs at {sizes} (no examples given; seeds {SEED}..{SEED + GENERATED - 1})"
