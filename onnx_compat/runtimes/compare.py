"""When a runtime's output is close enough to the eager reference, and when a reference proves nothing.

One rule for every check in the package (verification, streaming, the
contracts' decodes, ``onnx_compat.testing``), so an output is not right in
one place and wrong in another:

- Integers and booleans are equal or not: a token id or a length one off is
  wrong whatever the tolerance.
- Floats are close where ``|got - expected| <= atol + rtol * |expected|``
  (relative to the reference, as numpy's and torch's ``allclose`` read it).
- NaN and infinities must be the same value at the same place: NaN where the
  reference has NaN (a fully masked attention row gives NaN in PyTorch and
  must in the graph too), ``+inf`` where it has ``+inf``. A non-finite value
  on one side only is a mismatch of infinite size, never skipped.

A reference is degenerate when it cannot tell a right graph from a wrong
one: nothing to compare, all zeros, or a spread (standard deviation) of at
most ``DEGENERATE_SPREAD`` times its largest magnitude, constants among them.
A graph that returns zeros, or the constant, would pass against it. The floor
is relative because an absolute one depends on the output's units: a
forward-normalised FFT spreads by 3e-4 in all and is fine, while a power
spectrum of 1e3 plus round-off is not. Over all cases, sizes and outputs of
the five patch suites the smallest std / max |value| measured is 0.033
(fft_convolution), 30x above the floor. A single value has no spread and is
judged by being non-zero (a per-utterance score at batch 1). Only finite
values count: NaN in a reference is compared, not measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

DEGENERATE_SPREAD = 1e-3


@dataclass(frozen=True)
class Closeness:
    """How ``got`` compares with ``expected``: the largest errors over the compared elements and how many
    elements broke the rule (``mismatched`` of ``size``); ``nonfinite`` says where NaN or inf disagree."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    size: int
    exact: bool = False  # integers or booleans: compared for equality
    nonfinite: Optional[str] = None
    shapes: Optional[str] = None  # the shapes, when they differ

    def describe(self, atol: Optional[float] = None, rtol: Optional[float] = None) -> str:
        """One line for an error message (the caller says which output and at which sizes)."""
        if self.shapes:
            return f"shapes differ: {self.shapes}"
        share = f"{self.mismatched} / {self.size} ({100.0 * self.mismatched / max(self.size, 1):.3g}%)"
        rule = "exact" if self.exact else f"atol {atol:g}, rtol {rtol:g}" if atol is not None else None
        text = f"Mismatched elements: {share}, max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}"
        text += f" ({rule})" if rule else ""
        return text + (f"; {self.nonfinite}" if self.nonfinite else "")


RELATIVE_TO = ("value", "largest")


def closeness(got, expected, atol: float, rtol: float, mask: Optional[np.ndarray] = None, *,
              relative_to: str = "value") -> Closeness:
    """``got`` against the reference ``expected`` by the rule above; ``mask``: the elements compared
    (e.g. ``valid_mask``: frames within each sequence's length). Arrays or tensors (CPU).

    ``relative_to="largest"``: ``rtol`` is a fraction of the reference's largest finite magnitude rather
    than of each value, for checks that judge a whole output at once (a module's output in diagnosis, a
    consumer's result), where a value near zero inside it is not held to a tolerance of itself."""
    if relative_to not in RELATIVE_TO:
        raise ValueError(f"relative_to must be one of {list(RELATIVE_TO)}, got {relative_to!r}")
    got, expected = _array(got), _array(expected)
    if got.shape != expected.shape:
        return Closeness(False, float("inf"), float("inf"), max(got.size, expected.size), expected.size,
                         shapes=f"{list(got.shape)} vs {list(expected.shape)}")
    if mask is not None:
        got, expected = got[mask], expected[mask]
    exact = not (_floating(got) or _floating(expected))
    g, e = got.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    if not e.size:
        return Closeness(True, 0.0, 0.0, 0, 0, exact)
    both = np.isfinite(g) & np.isfinite(e)
    finite = bool(both.all())
    gf, ef = (g, e) if finite else (g[both], e[both])  # no copies in the usual all-finite case
    diff, size = np.abs(gf - ef), np.abs(ef)
    bound = 0.0 if exact else atol + rtol * (size if relative_to == "value" else magnitude(e))
    off = int(np.count_nonzero(diff > bound))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(size, 1e-12)).max()) if diff.size else 0.0
    nonfinite = None
    if not finite:
        # NaN matches NaN, inf matches inf of the same sign; anything else is an infinite error
        differ = ~both & ~((g == e) | (np.isnan(g) & np.isnan(e)))
        if differ.any():
            off += int(np.count_nonzero(differ))
            nonfinite = _nonfinite_reason(g, e, differ)
            max_abs = max_rel = float("inf")
    return Closeness(off == 0, max_abs, max_rel, off, int(e.size), exact, nonfinite)


def _nonfinite_reason(g: np.ndarray, e: np.ndarray, differ: np.ndarray) -> str:
    first = int(np.flatnonzero(differ)[0])
    return (f"{int(np.count_nonzero(differ))} non-finite value(s) differ, the first at flat index {first} "
            f"(got {g[first]}, expected {e[first]})")


def magnitude(reference) -> float:
    """The largest finite |value| of ``reference`` (0 when it has none): the scale a tolerance may be a
    fraction of (``testing``'s ``scaled``, diagnosis' per-module bound)."""
    values = _finite(reference)
    return float(np.abs(values).max()) if values.size else 0.0


def degenerate(reference) -> Optional[str]:
    """Why ``reference`` cannot tell a right output from a wrong one (see the module's doc), or None."""
    values = _finite(reference)
    if not values.size:
        return "no finite value to compare"
    scale = float(np.abs(values).max())
    if scale == 0:
        return "all zeros"
    if values.size > 1:
        spread = float(np.std(values))
        if not spread > DEGENERATE_SPREAD * scale:
            return (f"std {spread:.3g}, max |value| {scale:.3g} "
                    f"(the std must exceed {DEGENERATE_SPREAD:g} x max |value| > 0)")
    return None


def valid_mask(shape, lengths_by_axis: Mapping[int, np.ndarray]) -> np.ndarray:
    """True where every length-carrying axis is within its sequence's length (padding is free to differ)."""
    mask = np.ones(shape, dtype=bool)
    for axis, lengths in lengths_by_axis.items():
        index_shape = [1] * len(shape)
        index_shape[axis] = shape[axis]
        positions = np.arange(shape[axis]).reshape(index_shape)
        limit = np.asarray(lengths).reshape([-1] + [1] * (len(shape) - 1))
        mask &= positions < limit
    return mask


def _finite(x) -> np.ndarray:
    values = _array(x).astype(np.float64).ravel()
    finite = np.isfinite(values)
    return values if finite.all() else values[finite]


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _floating(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)
