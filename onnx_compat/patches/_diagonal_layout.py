"""Torch's layout of a diagonal, shared by the eager rewrite (``diagonals.py``) and the ONNX translations
(``_diagonal_onnx.py``): a module of its own so that neither imports the other (the translations need
onnxscript, which the eager rewrite must not pull in)."""
from __future__ import annotations

from typing import List


def last_two(rank: int, d1: int, d2: int) -> List[int]:
    """The permutation that moves dims ``d1``, ``d2`` last, the others keeping their order (torch's layout of
    a diagonal: the remaining dims, then the diagonal)."""
    return [d for d in range(rank) if d not in (d1, d2)] + [d1, d2]
