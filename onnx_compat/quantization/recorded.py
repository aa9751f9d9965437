"""What a quantized file says about itself: the recipe that made it, the float model it approximates, the
measures it met. Kept in the file's ``metadata_props`` under ``KEY`` as JSON.

Why: ``verify`` holds a model to ``atol`` against the eager model, which a
quantized model misses by design ("max abs err 1.14"); without a record in the
file nothing said the file was int8. A file that records a recipe is named as
such in ``verify``'s failure (``note``), which points to
``verify_quantized``: the measures it was made with, re-run against the eager
model. Reading the record is the pipeline's (``pipeline/approximate.py``), which
``verify`` uses without importing this layer.
"""
from __future__ import annotations

import json
from typing import Dict, Mapping, Sequence

import onnx

from .._version import __version__
from ..graph import set_metadata
from ..pipeline.approximate import KEY, note, read  # noqa: F401 - read and note are this record's reader

__all__ = ["KEY", "record", "stamp", "read", "note"]


def record(recipe: str, float_sha256: str, measures: Mapping[str, Sequence]) -> Dict[str, object]:
    """The record of one quantization: recipe, the float model's content hash, ``{output: {measure:
    threshold}}`` of the measures it was verified with, and the onnx_compat version that made it."""
    return {"recipe": recipe, "float_sha256": float_sha256,
            "measures": {o: {m.name: m.threshold for m in ms} for o, ms in measures.items()},
            "onnx_compat": __version__}


def stamp(path: str, entry: Mapping[str, object]) -> None:
    """Write ``entry`` into the model file at ``path`` (a working file; its other metadata kept)."""
    proto = onnx.load(path)
    set_metadata(proto, {KEY: json.dumps(entry, sort_keys=True)})
    onnx.save(proto, path)
