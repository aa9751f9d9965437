"""onnx_compat: unmodified PyTorch models that export cleanly to ONNX, with proof.

The public API, and only that. The layers below it: ``patches/`` (what is
swapped while an export runs), ``pipeline/`` (``export()`` and its stages),
``runtimes/`` and ``contracts/`` (where a model is run and what its consumer
requires), ``diagnosis/`` (the module at fault).
"""
import re as _re

import torch as _torch

from onnx_compat._version import __version__

if tuple(int(p) for p in _re.findall(r"\d+", _torch.__version__)[:2]) < (2, 0):
    raise ImportError(f"onnx_compat needs torch >= 2.0; this is torch {_torch.__version__} "
                      "(pip install 'torch>=2.0')")

from onnx_compat import _moved  # noqa: E402
from onnx_compat.errors import ExportError, OnnxCompatError, SpecError, VerificationError  # noqa: E402
from onnx_compat.graph import describe  # noqa: E402
from onnx_compat.patches.registry import available_patches, patched, unavailable_patches  # noqa: E402
from onnx_compat.api import export  # noqa: E402
from onnx_compat.pipeline.report import Report  # noqa: E402
from onnx_compat.pipeline.verification import verify  # noqa: E402
from onnx_compat.spec import Dim, TensorSpec  # noqa: E402

_moved.install()

# What a user calls, declares and catches; every other error is in ``onnx_compat.errors``.
__all__ = ["export", "verify", "diagnose", "describe", "check_rasr", "patched", "available_patches",
           "unavailable_patches", "export_streaming", "streamify", "quantize", "export_pretrained",
           "from_pretrained_dir", "export_label_scorer", "export_transducer", "Dim", "TensorSpec", "StateSpec",
           "Report", "OnnxCompatError", "ExportError", "VerificationError", "SpecError", "__version__"]


# Names whose layers load on first use: an export needs none of them, and a process (the CLI, a
# job that exports one model) should not pay for the consumers, diagnosis, streaming and quantization.
# The names after the first group were in ``__all__`` before it was kept short; they stay importable.
_LAZY = {"check_rasr": ("onnx_compat.contracts.rasr", "check_rasr"),
         "diagnose": ("onnx_compat.diagnosis", "diagnose"),
         **{name: ("onnx_compat.streaming", name) for name in ("export_streaming", "StateSpec", "streamify")},
         "quantize": ("onnx_compat.quantization", "quantize"),
         "export_label_scorer": ("onnx_compat.label_scorers", "export_label_scorer"),
         "combine_label_scorers": ("onnx_compat.label_scorers", "combine_label_scorers"),
         "export_transducer": ("onnx_compat.parts.transducer", "export_transducer"),
         "export_parts": ("onnx_compat.parts", "export_parts"),
         "export_whisper": ("onnx_compat.huggingface.whisper", "export_whisper"),
         "export_nemo_transducer": ("onnx_compat.parts.nemo_transducer", "export_nemo_transducer"),
         **{name: ("onnx_compat.parts.sherpa_tts", name) for name in ("export_vits", "export_matcha")},
         **{name: ("onnx_compat.parts.funasr", name) for name in ("export_sense_voice", "export_paraformer")},
         "QuantReport": ("onnx_compat.quantization", "QuantReport"),
         "from_pretrained_dir": ("onnx_compat.huggingface", "from_pretrained_dir"),
         "export_pretrained": ("onnx_compat.huggingface", "export_pretrained"),
         "Attempt": ("onnx_compat.pipeline.report", "Attempt"),
         **{name: ("onnx_compat.errors", name) for name in (
             "CaptureError", "Culprit", "DimSpecialized", "RuntimeUnavailable", "SpectralError", "TargetError",
             "StreamingError", "StreamMismatch", "NotStreamable", "QuantizationError", "LabelScorerError")}}
PUBLIC = frozenset(__all__) | frozenset(_LAZY)


def __getattr__(name: str):
    """Names whose modules load on first use; and ``onnx_compat.inspect``, the old name of ``describe``
    (it shadowed the standard library's module)."""
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name == "inspect":
        import warnings
        warnings.warn("onnx_compat.inspect is now onnx_compat.describe", DeprecationWarning, stacklevel=2)
        return describe
    raise AttributeError(f"module 'onnx_compat' has no attribute {name!r}")


_moved.guard_public_names(__name__, PUBLIC)
