"""The sweep's third round (issue #47, Deliver 4), second half: speech, music and state-space / recurrent
sequence models from libraries that neither earlier round nor the tests use.

Same rules as ``sweep_models.py``; registered with ``round=3`` (``sweep.py --round 3``). The OCR,
time-series and NLP models of round three are in ``sweep_models3.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out, wave  # noqa: F401


def _r3(library: str, kind: str):
    return entry(library, kind, round=3)
