"""``MODULE:FACTORY`` on the command line: the user's function that builds what a verb exports.

Every verb that takes a factory (``export``, ``verify``, ``diagnose``,
``quantize``, ``export-streaming``) calls it the same way, so a bad spec is
the same one line wherever it is given; each verb checks what it returned.
"""
from __future__ import annotations

import importlib
from typing import Type

from onnx_compat.errors import FactoryError


def call_factory(spec: str, error: Type[Exception] = FactoryError):
    """What ``spec``'s function returns; ``error`` (the verb's usage error) names what is wrong with ``spec``."""
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise error(f"expected MODULE:FACTORY, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise error(f"{module_name!r} has no callable {func_name!r}")
    return factory()
