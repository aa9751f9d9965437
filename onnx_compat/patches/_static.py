"""Sizes the exported graph may hold as constants."""
from __future__ import annotations

import warnings

import torch


def static_ints(sizes):
    """``sizes`` (kernel extents, head counts, head widths) as Python ints.

    While tracing, sizes are tensors and ``int()`` warns of a baked constant.
    Use only for sizes fixed by the model's parameters, never for batch or time.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(s) for s in sizes)
