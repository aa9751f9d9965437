"""The sweep's third round (issue #47, Deliver 4): sequence models beyond speech -- OCR line recognisers,
time-series models, NLP taggers and language models -- from libraries that neither earlier round nor the
tests use.

Same rules as ``sweep_models.py``: a tiny config of each library's main models, random init (or the
weights the package itself ships), no download at run time; wrappers only adapt I/O (lengths in, a
tuple or dict out). Registered with ``round=3`` so ``sweep.py --round 3`` runs and writes them apart
from the earlier rounds. The speech, music and state-space models of round three are in
``sweep_models3b.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out, wave  # noqa: F401


def _r3(library: str, kind: str):
    return entry(library, kind, round=3)
