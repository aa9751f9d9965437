"""What goes wrong in a streaming export, with the culprit as a field.

Every error here is raised before anything is written; its fields say which
state, output, chunk, batch size, module or attribute is at fault, so a caller
(or a test) need not parse the message.
"""
from __future__ import annotations

from typing import Optional

from onnx_compat.errors import OnnxCompatError


class StreamingError(OnnxCompatError, ValueError):
    """A streaming step that cannot be exported or streamed as declared."""

    def __init__(self, message: str, *, state: Optional[str] = None, output: Optional[str] = None,
                 chunk: Optional[int] = None, batch: Optional[int] = None, module: Optional[str] = None,
                 attribute: Optional[str] = None, exporter: Optional[str] = None) -> None:
        super().__init__(message)
        self.state, self.output, self.chunk, self.batch = state, output, chunk, batch
        self.module, self.attribute, self.exporter = module, attribute, exporter


class StreamMismatch(StreamingError):
    """The exported stream disagrees with the eager stream (an output at a chunk, or a state)."""


class StreamDrift(StreamMismatch):
    """Given ``full_forward``, the concatenated stream drifts from it past ``max_drift``: the step and the full
    forward disagree whatever the exporter, so no other exporter is tried."""


class NotStreamable(StreamingError):
    """``streamify`` met a layer that mixes time in a way a cache cannot reproduce."""
