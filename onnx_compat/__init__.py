"""onnx_compat: unmodified PyTorch models that export cleanly to ONNX, with proof."""
__version__ = "0.1.0"

import re as _re  # noqa: E402

import torch as _torch  # noqa: E402

if tuple(int(p) for p in _re.findall(r"\d+", _torch.__version__)[:2]) < (2, 0):
    raise ImportError(f"onnx_compat needs torch >= 2.0; this is torch {_torch.__version__} "
                      "(pip install 'torch>=2.0')")

from .registry import available_patches, patched, unavailable_patches  # noqa: E402
from .spec import Dim, TensorSpec  # noqa: E402
from .export import ExportError, export  # noqa: E402
from .io_adapter import SpecError  # noqa: E402
from .verify import VerificationError, verify  # noqa: E402
from .graph import inspect  # noqa: E402
from .rasr import check_rasr  # noqa: E402
from .patches._complex import SpectralError  # noqa: E402
from .targets import TargetError  # noqa: E402
from .runtimes import RuntimeUnavailable  # noqa: E402
from .diagnose import diagnose  # noqa: E402

__all__ = ["available_patches", "unavailable_patches", "patched", "Dim", "TensorSpec", "export", "verify", "inspect", "check_rasr", "diagnose",
           "ExportError", "SpecError", "SpectralError", "TargetError", "RuntimeUnavailable",
           "VerificationError", "__version__"]
