"""Old import paths of modules that moved when the package took its layers (issue #23).

``import onnx_compat.exporters`` and the like keep working, with a
``DeprecationWarning`` naming the new path, so a user's patch family or
script written against the old layout does not break; the names inside each
module are the same.

Three old paths (``onnx_compat.export``, ``.verify``, ``.diagnose``) are also
the names of public functions. Python's import binds a submodule as an
attribute of its package once it is imported, which would turn
``onnx_compat.verify`` into a module; ``guard_public_names`` keeps every
public name of the package what it was.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import FrozenSet

MOVED = {
    "onnx_compat.export": "onnx_compat.pipeline",
    "onnx_compat.exporters": "onnx_compat.pipeline.capture",
    "onnx_compat.io_adapter": "onnx_compat.pipeline.adapter",
    "onnx_compat.verify": "onnx_compat.pipeline.verification",
    "onnx_compat.report": "onnx_compat.pipeline.report",
    "onnx_compat.repair": "onnx_compat.int_repair",
    "onnx_compat.pipeline.repair": "onnx_compat.int_repair",
    "onnx_compat.cleanup": "onnx_compat.pipeline.cleanup",
    "onnx_compat.weights": "onnx_compat.pipeline.weights",
    "onnx_compat.targets": "onnx_compat.pipeline.releases",
    "onnx_compat.vanilla": "onnx_compat.pipeline.vanilla",
    "onnx_compat.safety": "onnx_compat.model_state",
    "onnx_compat.flags": "onnx_compat.patches.when",
    "onnx_compat.registry": "onnx_compat.patches.registry",
    "onnx_compat.changes": "onnx_compat.patches.changes",
    "onnx_compat.padding": "onnx_compat.patches._padding",
    "onnx_compat.rnn_onnx": "onnx_compat.patches._rnn_onnx",
    "onnx_compat.rasr": "onnx_compat.contracts.rasr",
    "onnx_compat.culprit": "onnx_compat.diagnosis.culprit",
    "onnx_compat.diagnose": "onnx_compat.diagnosis",
    "onnx_compat.patches.pointwise": "onnx_compat.patches.arithmetic",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands back the module at its new path (one module object, two names)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the module at the new path ran when it was imported."""


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


class _GuardedPackage(types.ModuleType):
    """The package's module type: importing a submodule never rebinds a public name of the package."""

    _public: FrozenSet[str] = frozenset()

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in type(self)._public:
            return  # ``import onnx_compat.verify``: the module is in sys.modules; the function stays
        super().__setattr__(name, value)


def guard_public_names(package: str, public: FrozenSet[str]) -> None:
    """Keep ``public`` names of ``package`` bound to the functions and classes they are."""
    module = sys.modules[package]
    guarded = type("_GuardedPackage", (_GuardedPackage,), {"_public": frozenset(public)})
    module.__class__ = guarded
