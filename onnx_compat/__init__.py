"""onnx_compat: unmodified PyTorch models that export cleanly to ONNX, with proof."""
from .registry import available_patches, patched

__version__ = "0.1.0"

__all__ = ["available_patches", "patched", "__version__"]
