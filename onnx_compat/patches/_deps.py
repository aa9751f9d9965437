"""The internal onnx_compat names the pattern families use, imported in this one place."""
from onnx_compat.patches.when import torchscript_exporting  # noqa: F401
