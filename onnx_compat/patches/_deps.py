"""The internal onnx_compat names the pattern families use, imported in this one place (paths may move)."""
from ..flags import torchscript_exporting  # noqa: F401
