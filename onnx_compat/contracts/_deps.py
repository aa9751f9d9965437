"""The internal onnx_compat names this package (and ``runtimes/openvino.py``) uses, imported in one place.

When internal modules move, only these lines change.
"""
from onnx_compat.contracts.rasr import check_rasr  # noqa: F401
from onnx_compat.errors import OnnxCompatError, RuntimeUnavailable  # noqa: F401
from onnx_compat.graph import load, set_metadata, value_info  # noqa: F401
from onnx_compat.runtimes import Runtime  # noqa: F401
from onnx_compat.model_state import preserved  # noqa: F401
