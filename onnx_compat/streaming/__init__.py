"""Streaming export: a model's step function with its caches as named state inputs and outputs.

``export_streaming`` exports one call and proves it by running the stream in
ONNX Runtime against eager PyTorch; ``StateSpec`` declares a state;
``streamify`` derives the step of a model built from causal layers.
"""
from .errors import NotStreamable, StreamDrift, StreamingError, StreamMismatch
from .states import StateSpec
from .api import export_streaming
from .streamify import streamify

__all__ = ["export_streaming", "StateSpec", "streamify", "StreamingError", "StreamMismatch", "StreamDrift", "NotStreamable"]
