"""The patch registry and ``patched()``.

A patch declares what it replaces and when it acts (``patch.py``); this module
keeps them and does all the swapping and restoring, so no patch touches ``setattr`` itself. Every
replacement is a ``wrapt.FunctionWrapper`` around the object found at entry (for an attribute such as
``Tensor.data``, around its getter):
``__wrapped__``, name and docs stay intact, and outside its moment (``when``)
the wrapper calls straight through, so eager code is unchanged.

``patched()`` may be nested and used from several threads: each patch is
applied on the first entry that selects it and restored on the last exit (a
reference count under one lock). Restoring puts back the very objects that
were there at entry.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import wrapt

from onnx_compat.errors import PatchError, PatchSelectionTypeError, PatchUnavailable
from onnx_compat.patches import on_import, when
from onnx_compat.patches.changes import Changes
from onnx_compat.patches.patch import Patch, _resolve

_REGISTRY: Dict[str, Patch] = {}
_LOCK = threading.RLock()


def register(patch: Patch) -> Patch:
    """Add ``patch``; names and targets must be unique across the registry."""
    with _LOCK:
        if patch.name in _REGISTRY:
            raise PatchError(f"a patch named {patch.name!r} is already registered", patch=patch.name)
        for other in _REGISTRY.values():
            shared = set(other.targets) & set(patch.targets)
            if shared:
                raise PatchError(f"patches {other.name!r} and {patch.name!r} both target {sorted(shared)}",
                                 patch=patch.name)
        _REGISTRY[patch.name] = patch
    return patch


def available_patches() -> Dict[str, str]:
    """Name -> one-line description of every patch usable with this torch and these libraries."""
    _load_families()
    return {name: p.description for name, p in _REGISTRY.items() if p.unavailable() is None}


def unavailable_patches() -> Dict[str, str]:
    """Name -> why it cannot be used here (torch too old, library absent or of another version)."""
    _load_families()
    reasons = {name: p.unavailable() for name, p in _REGISTRY.items()}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def steps_aside(name: str, exporter: str) -> bool:
    """Whether patch ``name`` leaves ``exporter`` alone on this torch (which does it right by itself)."""
    _load_families()
    return _REGISTRY[name].steps_aside(exporter)


def in_place(name: str) -> bool:
    """Whether patch ``name`` is in place right now (what a patch without targets asks, from another's hook)."""
    patch = _REGISTRY.get(name)
    return patch is not None and bool(patch._count)


def applied_patches() -> List[str]:
    """Names of the patches in place right now."""
    return [name for name, p in _REGISTRY.items() if p._count]


def _load_families() -> None:
    importlib.import_module("onnx_compat.patches.families")


def _own_value(owner, attr):
    own = getattr(owner, "__dict__", {})
    return own[attr] if attr in own else getattr(owner, attr)


def _skip_for_aliases(module_name: str) -> bool:
    # our own patch code is skipped; our bundled models are user code and get rebound
    return module_name == "torch" or module_name.startswith(("torch.", "onnx_compat.patches"))


def _apply(patch: Patch) -> Dict[int, Tuple[object, object]]:
    """Swap in ``patch``'s targets; returns its proxies by the id of what they wrap (for the alias scan)."""
    changes = Changes()
    proxies: Dict[int, object] = {}
    try:
        for target in patch.targets:
            found = _resolve(target, load=patch._loads(target))
            module = target.partition(":")[0]
            if found is not None:
                _swap(patch, found, changes, proxies)
            elif target in patch.on_import and module not in sys.modules:
                on_import.wait(module, patch, lambda t=target: _swap_loaded(patch, t))
        patch._script_ids = _register_for_script(proxies.values())
    except BaseException:
        on_import.forget(patch)
        changes.undo()
        raise
    patch._changes = changes
    return proxies


def _swap(patch: Patch, found: Tuple[object, str], changes: Changes, proxies: Dict[int, object]) -> None:
    """Put ``patch``'s wrapper where ``found`` (owner, attr) is; one wrapper per original object."""
    owner, attr = found
    original = _own_value(owner, attr)
    if id(original) not in proxies:
        proxies[id(original)] = (original, _proxy(patch, original))
    changes.setattr(owner, attr, proxies[id(original)][1])


def _proxy(patch: Patch, original):
    """The wrapper put in place of ``original``. An attribute with a setter and no call (``Tensor.data``, a C
    getset descriptor) is read through a property whose getter is the wrapper; writing it is left as it was."""
    if callable(original) or not hasattr(original, "__set__"):
        return wrapt.FunctionWrapper(original, patch.gate)

    def read(instance):
        return original.__get__(instance, type(instance))

    return property(wrapt.FunctionWrapper(read, patch.gate), original.__set__, None, original.__doc__)


def _swap_loaded(patch: Patch, target: str) -> None:
    """An ``on_import`` target whose module has just loaded, if the patch is still in place."""
    with _LOCK:
        found = _resolve(target, load=False)
        if patch._count and patch._changes is not None and found is not None:
            _swap(patch, found, patch._changes, {})


def _rebind_aliases(applied: Sequence[Tuple[Patch, Dict[int, Tuple[object, object]]]]) -> None:
    """Every module-level alias of a function just patched (``from torch.nn.functional import pad``) gets
    the proxy too; each rebinding is recorded with its own patch. Which names of which module hold such
    a function is remembered between blocks (``_ALIASES``), so only modules loaded or grown since are
    read again: reading every namespace of ~2,600 loaded modules took 10 ms per ``patched()``, an eighth
    of a small model's whole TorchScript export, on every export."""
    proxies = {key: (original, proxy, patch._changes)
               for patch, found in applied if patch.aliases for key, (original, proxy) in found.items()}
    if not proxies:
        return
    for module, namespace, key in _ALIASES.sites(frozenset(proxies)):
        value = namespace.get(key)
        hit = proxies.get(id(value))
        if hit is not None and hit[0] is value:
            hit[2].setattr(module, key, hit[1])


class _AliasIndex:
    """Which names of each loaded module hold one of the functions a set of patches wraps. A module is read
    again when it is another object under its name or its namespace changed size (a name added or
    deleted), and ``__main__`` always (a script defines names as it runs); another set of functions starts
    over. Runs under ``_LOCK``."""

    def __init__(self):
        self.ids: frozenset = frozenset()
        self.known: Dict[str, Tuple[object, int, List[str]]] = {}  # module name -> (module, len(namespace), names)

    def sites(self, ids: frozenset):
        if ids != self.ids:
            self.ids, self.known = ids, {}
        for name, module in list(sys.modules.items()):
            if module is None or _skip_for_aliases(name):
                continue
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            known = self.known.get(name)
            if known is None or known[0] is not module or known[1] != len(namespace) or name == "__main__":
                known = (module, len(namespace), [k for k, v in list(namespace.items()) if id(v) in ids])
                self.known[name] = known
            for key in known[2]:
                yield module, namespace, key


_ALIASES = _AliasIndex()


def _script_table():
    try:
        from torch.jit import _builtins
        return _builtins._get_builtin_table(), _builtins._find_builtin
    except (ImportError, AttributeError):
        return None, None


def _register_for_script(pairs: Iterable[Tuple[object, object]]) -> List[int]:
    """Let ``torch.jit.script`` compile a proxy as the aten op it wraps.

    The script compiler recognises builtins by identity; without this, a
    proxy in place of ``F.conv1d`` makes it try to compile the proxy as Python.
    """
    table, find = _script_table()
    if table is None:
        return []
    ids = []
    for original, proxy in pairs:
        op = find(original)
        if op is not None:
            table[id(proxy)] = op
            ids.append(id(proxy))
    return ids


def _restore(patch: Patch) -> None:
    on_import.forget(patch)
    table, _ = _script_table()
    if table is not None:
        for proxy_id in patch._script_ids:
            table.pop(proxy_id, None)
    patch._script_ids = []
    changes, patch._changes = patch._changes, None
    if changes is not None:
        changes.undo()


def _select(only: Optional[Iterable[str]], exclude: Optional[Iterable[str]]) -> Tuple[str, ...]:
    _load_families()
    if isinstance(only, str) or isinstance(exclude, str):
        raise PatchSelectionTypeError("only= and exclude= take a list of patch names, not a string",
                                      patch=only if isinstance(only, str) else exclude)
    only = None if only is None else list(only)
    known = list(_REGISTRY)
    for arg, names in (("only", only), ("exclude", exclude)):
        unknown = [n for n in (names or ()) if n not in _REGISTRY]
        if unknown:
            raise PatchError(f"patched({arg}=...): unknown patch name(s) {unknown}; known: {known}", patch=unknown[0])
    if only is not None:
        chosen = [n for n in known if n in set(only)]
        for name in chosen:
            reason = _REGISTRY[name].unavailable()
            if reason:
                raise PatchUnavailable(f"patch {name!r} is not available here: {reason}", patch=name)
    else:
        chosen = [n for n in known if _REGISTRY[n].unavailable() is None]
    drop = set(exclude or ())
    chosen = [n for n in chosen if n not in drop]
    needed, todo = set(chosen), list(chosen)
    while todo:
        name = todo.pop()
        for dep in _REGISTRY[name].requires:
            if dep in drop:
                raise PatchError(f"patched(): {name!r} needs {dep!r}, which exclude= removes", patch=dep)
            if dep not in needed:
                needed.add(dep)
                todo.append(dep)
    return tuple(n for n in known if n in needed)


def _acquire(names: Sequence[str]) -> None:
    with _LOCK:
        done: List[str] = []
        applied = []
        try:
            for name in names:
                patch = _REGISTRY[name]
                if patch._count == 0:
                    applied.append((patch, _apply(patch)))
                patch._count += 1
                done.append(name)
            _rebind_aliases(applied)
        except BaseException:
            _release(done)
            raise


def _release(names: Sequence[str]) -> None:
    with _LOCK:
        errors = []
        for name in reversed(names):
            patch = _REGISTRY[name]
            patch._count -= 1
            if patch._count == 0:
                try:
                    _restore(patch)
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]


class patched(contextlib.ContextDecorator):
    """Swap in the export-friendly patches while the block (or function) runs.

    ``only``/``exclude`` pick patches by name (see ``available_patches()``).
    ``during_trace=True`` also acts inside a plain ``torch.jit.trace``, for
    pipelines that trace first and export the traced module later.
    """

    def __init__(self, only: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None,
                 during_trace: bool = False) -> None:
        self.names = _select(only, exclude)
        self.during_trace = bool(during_trace)

    def __enter__(self) -> "patched":
        _acquire(self.names)
        if self.during_trace:
            when.request_trace(+1)
        return self

    def __exit__(self, *exc_info) -> bool:
        try:
            if self.during_trace:
                when.request_trace(-1)
        finally:
            _release(self.names)
        return False

    def __repr__(self) -> str:
        return f"patched(only={list(self.names)}, during_trace={self.during_trace})"
