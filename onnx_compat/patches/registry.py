"""The patch registry and ``patched()``.

A patch declares what it replaces and when it acts; this module does all the
swapping and restoring, so no patch touches ``setattr`` itself. Every
replacement is a ``wrapt.FunctionWrapper`` around the object found at entry:
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
import importlib.metadata
import importlib.util
import inspect
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import wrapt

from onnx_compat import versions

from onnx_compat.patches import on_import, when
from onnx_compat.patches.changes import Changes

Wrapper = Callable  # (wrapped, instance, args, kwargs) -> result


@dataclass
class Patch:
    """One swap: ``targets`` ("module:attr.path") are wrapped by ``wrapper``.

    ``wrapper(wrapped, instance, args, kwargs)`` runs only while ``when`` holds
    (a key of ``when.WHEN``); otherwise the original is called unchanged.
    ``optional`` targets may be missing from older torch versions.
    ``aliases``: also rebind module-level aliases of the targets in loaded
    non-torch modules (``from torch.nn.functional import conv1d``).
    ``requires``: patches this one cannot work without; selecting it selects them.
    ``library``: the targets belong to a third-party package (e.g. "transformers").
    Its modules are never imported here: a target is patched only when the user's
    code has loaded its module, and the patch is unavailable when the package is
    not installed. ``signature``: the leading parameter names each target must
    have; a version whose helper differs leaves the patch unavailable rather
    than wrapping the wrong function. ``native``: exporter -> the first torch
    release whose exporter gets this right by itself (measured by ``make
    test-matrix``); from there on the patch steps aside under that exporter.
    ``min_torch``: the first torch release the patch works with; older ones
    report it unavailable, naming that release. ``on_import``: targets in an
    exporter's own modules, never imported here (``on_import.py`` says why):
    patched when their module is loaded at entry or loads while the patch is
    in place; like ``optional`` ones, they may be missing.
    """

    name: str
    description: str
    targets: Sequence[str]
    wrapper: Wrapper
    when: str = "export"
    optional: Sequence[str] = ()
    aliases: bool = True
    requires: Sequence[str] = ()
    library: Optional[str] = None
    signature: Optional[Sequence[str]] = None
    native: Mapping[str, str] = field(default_factory=dict)
    min_torch: Optional[str] = None
    on_import: Sequence[str] = ()
    # runtime state, owned by the registry
    _count: int = field(default=0, repr=False)
    _changes: Optional[Changes] = field(default=None, repr=False)
    _script_ids: List[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.when not in when.WHEN:
            raise ValueError(f"patch {self.name!r}: unknown when={self.when!r}; choose from {sorted(when.WHEN)}")
        if not set(self.on_import) <= set(self.targets):
            raise ValueError(f"patch {self.name!r}: on_import names targets it does not have: "
                             f"{sorted(set(self.on_import) - set(self.targets))}")
        unknown = set(self.native) - {"dynamo", "torchscript"}
        if unknown:
            raise ValueError(f"patch {self.name!r}: native= takes exporters 'dynamo'/'torchscript', not {sorted(unknown)}")
        self._active = when.WHEN[self.when]
        # the exporters of this torch that need no patch here: the gate calls straight through under them
        self._native = tuple(when.WHEN[e] for e, release in self.native.items() if versions.torch_at_least(release))

    def steps_aside(self, exporter: str) -> bool:
        """This torch's ``exporter`` gets it right by itself, so the patch leaves it alone."""
        return exporter in self.native and versions.torch_at_least(self.native[exporter])

    def missing(self) -> List[str]:
        """Required targets this torch does not have (a library's targets are never required)."""
        if self.library:
            return []
        return [t for t in self.targets
                if t not in self.optional and t not in self.on_import and _resolve(t) is None]

    def unavailable(self) -> Optional[str]:
        """Why this patch cannot be used here, or None."""
        if self.library and importlib.util.find_spec(self.library) is None:
            return f"{self.library} is not installed"
        if self.min_torch and not versions.torch_at_least(self.min_torch):
            return f"needs torch >= {self.min_torch} (this is {torch.__version__})"
        if self.when == "dynamo" and not versions.HAS_DYNAMO:
            return f"acts only under the dynamo exporter; {versions.NO_DYNAMO}"
        missing = self.missing()
        if missing:
            return f"torch {torch.__version__} lacks {', '.join(missing)}"
        for target in self.targets:
            found = _resolve(target, load=self._loads(target))
            if found is None or self.signature is None:
                continue
            names = _parameter_names(getattr(*found))
            if names is not None and names[:len(self.signature)] != list(self.signature):
                version = _version(self.library) if self.library else torch.__version__
                return (f"{target} in {self.library or 'torch'} {version} takes ({', '.join(names)}), "
                        f"not ({', '.join(self.signature)}, ...)")
        return None

    def _loads(self, target: str) -> bool:
        """Whether finding ``target`` may import its module."""
        return not self.library and target not in self.on_import

    def gate(self, wrapped, instance, args, kwargs):
        if self._count and self._active() and not any(native() for native in self._native):
            return self.wrapper(wrapped, instance, args, kwargs)
        return wrapped(*args, **kwargs)


_REGISTRY: Dict[str, Patch] = {}
_LOCK = threading.RLock()


def register(patch: Patch) -> Patch:
    """Add ``patch``; names and targets must be unique across the registry."""
    with _LOCK:
        if patch.name in _REGISTRY:
            raise ValueError(f"a patch named {patch.name!r} is already registered")
        for other in _REGISTRY.values():
            shared = set(other.targets) & set(patch.targets)
            if shared:
                raise ValueError(f"patches {other.name!r} and {patch.name!r} both target {sorted(shared)}")
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


def applied_patches() -> List[str]:
    """Names of the patches in place right now."""
    return [name for name, p in _REGISTRY.items() if p._count]


def _load_families() -> None:
    importlib.import_module("onnx_compat.patches.families")


def _resolve(target: str, load: bool = True):
    """``(owner, attr)`` for "module:attr.path", or None when it does not exist
    (or, with ``load=False``, when its module has not been imported)."""
    module_name, _, path = target.partition(":")
    if not load:
        owner = sys.modules.get(module_name)
        if owner is None:
            return None
    else:
        try:
            owner = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - absent, or a library that does not import with this torch
            return None
    *parents, attr = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if not hasattr(owner, attr):
        return None
    return owner, attr


def _parameter_names(fn) -> Optional[List[str]]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


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
            if found is not None:
                _swap(patch, found, changes, proxies)
            elif target in patch.on_import and target.partition(":")[0] not in sys.modules:
                on_import.wait(target.partition(":")[0], patch, lambda t=target: _swap_loaded(patch, t))
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
        proxies[id(original)] = (original, wrapt.FunctionWrapper(original, patch.gate))
    changes.setattr(owner, attr, proxies[id(original)][1])


def _swap_loaded(patch: Patch, target: str) -> None:
    """An ``on_import`` target whose module has just loaded, if the patch is still in place."""
    with _LOCK:
        found = _resolve(target, load=False)
        if patch._count and patch._changes is not None and found is not None:
            _swap(patch, found, patch._changes, {})


def _rebind_aliases(applied: Sequence[Tuple[Patch, Dict[int, Tuple[object, object]]]]) -> None:
    """One pass over the loaded modules for every patch just applied (a pass per patch cost
    ~3 ms each with ~1,500 modules loaded); each rebinding is recorded with its own patch."""
    proxies = {key: (original, proxy, patch._changes)
               for patch, found in applied if patch.aliases for key, (original, proxy) in found.items()}
    if not proxies:
        return
    for module_name, module in list(sys.modules.items()):
        if module is None or _skip_for_aliases(module_name):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            hit = proxies.get(id(value))
            if hit is not None and hit[0] is value:
                hit[2].setattr(module, key, hit[1])


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
        raise TypeError("only= and exclude= take a list of patch names, not a string")
    only = None if only is None else list(only)
    known = list(_REGISTRY)
    for arg, names in (("only", only), ("exclude", exclude)):
        unknown = [n for n in (names or ()) if n not in _REGISTRY]
        if unknown:
            raise ValueError(f"patched({arg}=...): unknown patch name(s) {unknown}; known: {known}")
    if only is not None:
        chosen = [n for n in known if n in set(only)]
        for name in chosen:
            reason = _REGISTRY[name].unavailable()
            if reason:
                raise RuntimeError(f"patch {name!r} is not available here: {reason}")
    else:
        chosen = [n for n in known if _REGISTRY[n].unavailable() is None]
    drop = set(exclude or ())
    chosen = [n for n in chosen if n not in drop]
    needed, todo = set(chosen), list(chosen)
    while todo:
        name = todo.pop()
        for dep in _REGISTRY[name].requires:
            if dep in drop:
                raise ValueError(f"patched(): {name!r} needs {dep!r}, which exclude= removes")
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
