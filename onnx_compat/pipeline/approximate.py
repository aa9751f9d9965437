"""A model file that says it approximates another (a quantized model records its recipe): read here, in the
pipeline, so ``verify``'s failure can say what the file is without importing the layer that made it.

``onnx_compat.quantization`` writes the record (``quantization/recorded.py``)
under ``KEY`` in ``metadata_props`` as JSON: recipe, the float model's content
hash, the measures it met. ``verify`` holds a model to ``atol`` against the
eager model, which a quantized model misses by design ("max abs err 1.14");
``note`` is what its failure adds for such a file: what it is and the check
that fits it.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import onnx

KEY = "onnx_compat.quantization"


def read(model) -> Optional[dict]:
    """The record a model (path or proto) holds, or None (a float model, or a file that does not load: the
    caller reports that)."""
    if model is None:
        return None
    try:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model),
                                                                            load_external_data=False)
        found = json.loads(next((p.value for p in proto.metadata_props if p.key == KEY), "null"))
    except Exception:  # noqa: BLE001 - no record is what a file that does not load, or a stray value, holds
        return None
    return found if isinstance(found, dict) and found.get("recipe") else None


def note(model) -> str:
    """What ``verify``'s failure adds for a file that records a recipe (empty for any other file)."""
    found = read(model)
    if found is None:
        return ""
    measures = "; ".join(f"{o}: " + ", ".join(f"{m} >= {t:g}" for m, t in ms.items())
                         for o, ms in (found.get("measures") or {}).items())
    return (f" [this file is a quantized model ({found['recipe']}, made by onnx_compat's quantize from the float "
            f"model {str(found.get('float_sha256', '?'))[:19]}...): its values differ from the eager model's by "
            "design, so verify's atol does not apply to it; check it with "
            "onnx_compat.quantization.verify_quantized(path, model, inputs, outputs), which re-runs the measures "
            f"it was made with ({measures or 'snr, cosine'}) against the eager model, or verify the float model]")
