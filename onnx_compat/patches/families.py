"""The default set of patch families, assembled in one place: importing this module registers each.

The registry imports it on first use, so ``import onnx_compat`` stays cheap and a
family's own imports (third-party helpers) happen only when patches are wanted.
"""
from onnx_compat.patches import conv  # noqa: F401
from onnx_compat.patches import attention  # noqa: F401
from onnx_compat.patches import compact_attention  # noqa: F401
from onnx_compat.patches import recurrent  # noqa: F401
from onnx_compat.patches import arithmetic  # noqa: F401
from onnx_compat.patches import norms  # noqa: F401
from onnx_compat.patches import windows  # noqa: F401
from onnx_compat.patches import pooling  # noqa: F401
from onnx_compat.patches import resize  # noqa: F401
from onnx_compat.patches import sequences  # noqa: F401
from onnx_compat.patches import transformers_helpers  # noqa: F401
from onnx_compat.patches import spectral  # noqa: F401
from onnx_compat.patches import fft_lengths  # noqa: F401
from onnx_compat.patches import overlap_add  # noqa: F401
from onnx_compat.patches import stores  # noqa: F401
from onnx_compat.patches import checks  # noqa: F401
from onnx_compat.patches import shape_ops  # noqa: F401
from onnx_compat.patches import scripted  # noqa: F401
from onnx_compat.patches import compiled  # noqa: F401
from onnx_compat.patches import size_math  # noqa: F401
from onnx_compat.patches import slice_from_end  # noqa: F401
from onnx_compat.patches import loops  # noqa: F401
from onnx_compat.patches import constants  # noqa: F401
from onnx_compat.patches import shape_libraries  # noqa: F401
from onnx_compat.patches import lengths  # noqa: F401
from onnx_compat.patches import int_calls  # noqa: F401
from onnx_compat.patches import length_caches  # noqa: F401
from onnx_compat.patches import int_types  # noqa: F401
from onnx_compat.patches import linalg  # noqa: F401
from onnx_compat.patches import diagonals  # noqa: F401
from onnx_compat.patches import data_reads  # noqa: F401
from onnx_compat.patches import draws  # noqa: F401
from onnx_compat.patches import padding_mask  # noqa: F401
from onnx_compat.patches import fixed_pieces  # noqa: F401
from onnx_compat.patches import autograd_in_forward  # noqa: F401
from onnx_compat.patches import range_guards  # noqa: F401
from onnx_compat.patches import size_branches  # noqa: F401
from onnx_compat.patches import empty_skips  # noqa: F401
from onnx_compat.patches import index_lists  # noqa: F401
from onnx_compat.patches import exact_identities  # noqa: F401
from onnx_compat.patches import split_folding  # noqa: F401
from onnx_compat.patches import translation_table  # noqa: F401
from onnx_compat.patches import multi_output_matches  # noqa: F401
from onnx_compat.patches import caught_module_errors  # noqa: F401
from onnx_compat.patches import strict_retry  # noqa: F401
from onnx_compat.patches import complex_linalg  # noqa: F401
