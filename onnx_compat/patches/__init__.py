"""Patch families. Importing this package registers every family."""
from . import conv  # noqa: F401
from . import attention  # noqa: F401
from . import recurrent  # noqa: F401
from . import pointwise  # noqa: F401
from . import norms  # noqa: F401
from . import windows  # noqa: F401
from . import pooling  # noqa: F401
from . import resize  # noqa: F401
from . import sequences  # noqa: F401
from . import transformers_helpers  # noqa: F401
from . import spectral  # noqa: F401
from . import overlap_add  # noqa: F401
from . import checks  # noqa: F401
from . import shape_ops  # noqa: F401
from . import scripted  # noqa: F401
from . import size_math  # noqa: F401
from . import loops  # noqa: F401
