"""Which torch this is, and which exporter features it has.

The release boundaries here are measured (``make test-matrix``): a patch names
the release it needs or the one from which torch does the right thing itself,
and the pipeline uses the dynamo exporter only from the release on which it
verifies.
"""
from __future__ import annotations

import inspect
import re
from typing import Tuple

import torch


def _release(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


TORCH = _release(torch.__version__)


def torch_at_least(version: str) -> bool:
    """This torch is ``version`` or newer (local build tags such as ``+cpu`` ignored)."""
    return TORCH >= _release(version)


EXPORT_PARAMS = inspect.signature(torch.onnx.export).parameters
# torch.onnx.export(dynamo=True, dynamic_shapes=...): the dynamo exporter as onnx_compat uses it, from 2.13 on.
# make test-matrix: 2.4 has dynamo= without dynamic_shapes=; 2.6 has both but bakes dims passed as Dim.DYNAMIC
# hints (127 tests fail); 2.8 fails 33 that 2.13 passes (ISTFT/complex and pad translations, LSTMP capture).
# 2.9-2.12 are not in the matrix; below 2.13 auto is TorchScript alone, which verifies there.
DYNAMO_SINCE = "2.13"
HAS_DYNAMO = "dynamo" in EXPORT_PARAMS and "dynamic_shapes" in EXPORT_PARAMS and torch_at_least(DYNAMO_SINCE)
NO_DYNAMO = f"onnx_compat uses torch's dynamo exporter from torch {DYNAMO_SINCE} on (this is {torch.__version__})"
