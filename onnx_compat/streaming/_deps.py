"""The only place the streaming package reaches into onnx_compat's internal modules.

The lead renames internal modules; when a path moves, this file is the one to fix.
"""
from ..report import Attempt, Report  # noqa: F401
from ..safety import check_writable, preserved  # noqa: F401
from ..verify import session  # noqa: F401
from ..io_adapter import flatten  # noqa: F401
from ..flags import HAS_DYNAMO  # noqa: F401
