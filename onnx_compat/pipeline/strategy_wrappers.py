"""Capture strategies that capture through another (``capture.AUTO`` assembles them): the same exporter without
the patches (``Unpatched``), and dynamo with its chunk loops as one step (``WholeChunks``). Each has the inner
strategy's exporter name, availability and error sites; what it changes is said in its own docstring."""
from __future__ import annotations

from typing import List, Optional

import onnx

from onnx_compat.errors import UnsupportedPattern, reraise_interrupt
from onnx_compat.patches import memory_chunks


class Around:
    """A strategy that captures through another (``inner``): that one's exporter, availability and error sites."""

    def __init__(self, inner, label: str) -> None:
        self.inner = inner
        self.name, self.label = inner.name, label

    def unavailable(self) -> Optional[str]:
        return self.inner.unavailable()

    def locate(self, exc: BaseException, request) -> dict:
        return self.inner.locate(exc, request)


class WholeChunks(Around):
    """dynamo again with each loop over pieces of a dynamic dim (``x.chunk(n, d)``, ``x.split(s, d)``, their count a
    function of the length) run as one step over the whole dim, where the model's eager output at the example is
    the same so (``patches/memory_chunks.py``: a cut that only saves memory). Tried only after the patched dynamo
    attempt stopped at such pieces (``wanted``): another capture costs seconds."""

    patches = True

    def __init__(self, inner) -> None:
        super().__init__(inner, f"{inner.label}, chunk loops as one step")

    def wanted(self, attempts, errors) -> bool:
        first = _patched_attempt(self.name, attempts)
        return first is not None and bool(first.counted)

    def capture(self, request, captured) -> onnx.ModelProto:
        sites: List[str] = []
        try:
            with memory_chunks.taking_whole(sites):
                proto = self.inner.capture(request, captured)
        except Exception as exc:  # the model's own code refused its pieces as one (an assert on a piece's size)
            reraise_interrupt(exc)
            if not sites:
                raise
            raise memory_chunks.stopped(sites, exc, "the capture stops") from exc
        if not sites:
            raise UnsupportedPattern("no loop over pieces of a dynamic dim was reached: nothing to run as one step")
        captured.assumed.append(memory_chunks.check_whole(request.model, request.args, sites))
        return proto


class Unpatched(Around):
    """An exporter without the patches: a patch that turns a model the plain export verifies into a failure
    (an op it rewrites into one the exporter lacks, a complex spectrum the pair type cannot follow) must not
    cost the user the graph. Tried after the patched attempts failed, and only when a patch acted in them."""

    patches = False

    def __init__(self, inner) -> None:
        super().__init__(inner, f"{inner.label} without the patches")

    def wanted(self, attempts, errors) -> bool:
        """Not when the exporter's patched attempt ran with no patch acting (without them it is the same export),
        nor when dynamo's patched attempt ended in a deliberate refusal (``UnsupportedPattern``: a size made a
        Python number, a loop over a dim): the plain export freezes that size, and learns it slowest (torch.onnx's
        strict retry of mambapy's log2(T) scan ran past 240 s, ``patches/strict_retry.py``)."""
        from onnx_compat.patches.strict_retry import refusal_in
        patched = _patched_attempt(self.name, attempts)
        if patched is None:
            return True
        refused = self.name == "dynamo" and refusal_in(errors.get(id(patched))) is not None
        return bool(patched.acted) and not refused

    def capture(self, request, captured) -> onnx.ModelProto:
        return self.inner.capture(request, captured)

    def __repr__(self) -> str:
        return f"Unpatched({self.inner.label})"


def _patched_attempt(exporter: str, attempts):
    """The exporter's attempt under the patches, if it ran."""
    return next((a for a in attempts if a.exporter == exporter and a.patched), None)
