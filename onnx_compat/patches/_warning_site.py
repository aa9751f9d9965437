"""TracerWarnings said at the model's line, not at the wrapper's.

A wrapped torch call that warns with a stack level (``torch.tensor`` under the
TorchScript tracer: "results are registered as constants"; ``tolist``:
"Converting a tensor to a Python list") would name the registry's gate as the
place, and the pipeline's "frozen into the graph by Python code at ..." hint
would point into onnx_compat. These helpers find the calling code's frame and
say the warnings there.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

from onnx_compat.patches.registry import Patch


def model_frame(depth: int = 1):
    """The first frame above ``depth`` that is neither the registry's gate nor onnx_compat's patches."""
    frame = sys._getframe(depth + 1)
    while frame is not None and (frame.f_code is Patch.gate.__code__
                                 or frame.f_globals.get("__name__", "").startswith(__package__)):
        frame = frame.f_back
    return frame


_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


_MACHINERY = (__package__, __package__.rsplit(".", 1)[0] + ".pipeline")  # the patches, the verification


def model_frame_outside_torch(depth: int = 1):
    """``model_frame``, past torch's own frames and the pipeline's too: a call that reached a patch through
    torch's function handler (non-strict export's ``__torch_function__``), or a ``TorchFunctionMode`` of the
    verification, is named at the model's line, not torch's or onnx_compat's."""
    frame = model_frame(depth + 1)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(_TORCH)
                                 or frame.f_globals.get("__name__", "").startswith(_MACHINERY)):
        frame = frame.f_back
    return frame


def frame_site(frame) -> str:
    """``file:line`` of a frame, or "the model" when none was found."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the model"


def said_at(frame, call, *args, **kwargs):
    """``call(*args, **kwargs)``, its warnings re-issued at ``frame``'s line."""
    if frame is None:
        return call(*args, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call(*args, **kwargs)
    for record in caught:
        warnings.warn_explicit(record.message, record.category, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__"))
    return result
