"""The internal onnx_compat names this package uses, imported in one place.

onnx_compat's internal modules are being moved; when they are, only these
lines change.
"""
from ..graph import load, set_metadata, value_info  # noqa: F401
from ..rasr import check_rasr  # noqa: F401
from ..runtimes import Runtime, RuntimeUnavailable  # noqa: F401,E402
