"""The only place the parts package reaches into onnx_compat's internal modules (one file to fix on a move)."""
from onnx_compat.graph import load, value_info  # noqa: F401
from onnx_compat.model_state import preserved  # noqa: F401
from onnx_compat.pipeline.adapter import flatten  # noqa: F401
from onnx_compat.pipeline.report import Report  # noqa: F401
from onnx_compat.runtimes.session import open_session as session  # noqa: F401
from onnx_compat.spec import dim_sizes, make_inputs  # noqa: F401
from onnx_compat.pipeline.steps import Step  # noqa: F401
