"""What a patch is: the targets it wraps, when its wrapper acts, and whether it can be used here.

The declaration and its checks against this torch and these libraries; the
registry (``registry.py``) keeps the patches and does the swapping.
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
from typing import Callable, List, Mapping, Optional, Sequence

import torch

from onnx_compat import versions
from onnx_compat.errors import PatchError

from onnx_compat.patches import when
from onnx_compat.patches.changes import Changes

Wrapper = Callable  # (wrapped, instance, args, kwargs) -> result

_ACTING: List[set] = []  # the open ``acting()`` records, each the names of the patches whose wrapper ran


@contextlib.contextmanager
def acting():
    """The names of the patches whose wrapper ran while it is open. An export in which none ran is the
    plain export: the pipeline then does not retry it without the patches (``pipeline/capture.py``)."""
    found: set = set()
    _ACTING.append(found)
    try:
        yield found
    finally:
        _ACTING.remove(found)


_IDLE = threading.local()  # names of the patches whose wrapper said it changed nothing this call


def through(wrapped, instance, args, kwargs):
    """The wrapper of a patch without targets of its own (another patch's hook asks whether it is in place)."""
    return wrapped(*args, **kwargs)


def acted(name: str) -> None:
    """Patch ``name`` changed this export though no wrapper of its own ran (a patch without targets, asked by
    another's hook): counted as acting, as a wrapper's call is."""
    for record in _ACTING:
        record.add(name)


def idle(name: str) -> None:
    """Patch ``name``'s wrapper, now running, changed nothing this call (a hook that runs at every export and
    only looks, or leaves the call to torch): the call does not count as the patch acting, so the pipeline's
    retry without the patches is skipped as before. An earlier call that acted still counts."""
    if not _ACTING:
        return
    names = getattr(_IDLE, "names", None)
    if names is None:
        names = _IDLE.names = set()
    names.add(name)


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
            raise PatchError(f"patch {self.name!r}: unknown when={self.when!r}; choose from {sorted(when.WHEN)}",
                             patch=self.name)
        if not set(self.on_import) <= set(self.targets):
            raise PatchError(f"patch {self.name!r}: on_import names targets it does not have: "
                             f"{sorted(set(self.on_import) - set(self.targets))}", patch=self.name)
        unknown = set(self.native) - {"dynamo", "torchscript"}
        if unknown:
            raise PatchError(f"patch {self.name!r}: native= takes exporters 'dynamo'/'torchscript', not {sorted(unknown)}",
                             patch=self.name)
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
            if not _ACTING:
                return self.wrapper(wrapped, instance, args, kwargs)
            fresh = [record for record in _ACTING if self.name not in record]
            for record in fresh:
                record.add(self.name)
            try:
                return self.wrapper(wrapped, instance, args, kwargs)
            finally:
                names = getattr(_IDLE, "names", None)
                if names and self.name in names:
                    names.discard(self.name)
                    for record in fresh:
                        record.discard(self.name)
        return wrapped(*args, **kwargs)


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
