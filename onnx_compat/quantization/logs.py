"""What ONNX Runtime's quantization tools log while we call them: kept off the terminal, into the report.

``quantize_static``/``quantize_dynamic`` log "Please consider to run pre-processing before quantization" on
every call (through the root logger, which sets up a stderr handler when there is none). Pre-processing is
left out on purpose here (it renames and fuses nodes, and exclusion names nodes), so that advice is dropped;
anything else they log is kept in ``QuantReport.messages``, once each.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, List

DROPPED = ("Please consider to run pre-processing before quantization",  # quantize_dynamic's wording
           "Please consider pre-processing before quantization")  # quantize_static's


class _Collect(logging.Handler):
    def __init__(self, into: List[str]):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().strip()
        if text and not text.startswith(DROPPED) and text not in self.into:
            self.into.append(text)


@contextmanager
def captured(into: List[str]) -> Iterator[None]:
    """Records of WARNING and above that reach the root logger go to ``into`` instead of its handlers for the
    duration (the handlers are put back after; none is created on the way)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [_Collect(into)]
    try:
        yield
    finally:
        root.handlers = saved
