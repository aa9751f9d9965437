"""Patch targets in modules that load while the patch is in place.

Some targets live in an exporter's own modules (``torch._export.non_strict_utils``
for dynamo). Importing such a module to patch it would cost every export what
only that exporter needs: that one brings dynamo and sympy, about 1 s, into a
TorchScript export that never uses them. So the registry leaves such a target
alone while its module is not loaded. If the module loads while the patch is in
place (the dynamo exporter imports it), a finder at the front of
``sys.meta_path`` patches it right after the module has run. The finder is
there only while something waits, and a module it saw keeps its own loader.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable, Dict, List, Tuple

_LOCK = threading.RLock()
_waiting: Dict[str, List[Tuple[object, Callable[[], None]]]] = {}  # module -> (key, what to do once it ran)


def wait(module: str, key: object, then: Callable[[], None]) -> None:
    """Call ``then`` once ``module`` has been imported, unless ``forget(key)`` comes first."""
    with _LOCK:
        _waiting.setdefault(module, []).append((key, then))
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def forget(key: object) -> None:
    """Drop what ``key`` waits for; the finder leaves ``sys.meta_path`` when nothing waits."""
    with _LOCK:
        for module in list(_waiting):
            _waiting[module] = [(k, then) for k, then in _waiting[module] if k is not key]
            if not _waiting[module]:
                del _waiting[module]
        if not _waiting and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _loaded(module) -> None:
    with _LOCK:
        pending = _waiting.pop(module.__name__, [])
    for _key, then in pending:
        then()


class _ThenNotify(importlib.abc.Loader):
    """The module's own loader, and a call once the module has run; then the module gets its loader back."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _loaded(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _waiting or getattr(self._finding, "name", None) == fullname:
            return None
        self._finding.name = fullname  # the finders after this one find the real spec
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenNotify(spec.loader)
        return spec


_FINDER = _Finder()
