"""The only place the streaming package reaches into onnx_compat's internal modules.

The lead renames internal modules; when a path moves, this file is the one to fix.
"""
from onnx_compat.model_state import preserved  # noqa: F401
from onnx_compat.pipeline.adapter import flatten  # noqa: F401
from onnx_compat.pipeline.files import check_writable  # noqa: F401
from onnx_compat.pipeline.report import Attempt, Report  # noqa: F401
from onnx_compat.pipeline.verification import session  # noqa: F401
from onnx_compat.versions import HAS_DYNAMO  # noqa: F401
