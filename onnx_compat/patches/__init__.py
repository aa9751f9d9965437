"""Patch families. Importing this package registers every family."""
from . import conv  # noqa: F401
from . import attention  # noqa: F401
from . import recurrent  # noqa: F401
