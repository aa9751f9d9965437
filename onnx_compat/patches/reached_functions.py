"""The Python functions a model's forward may run, found once and kept while nothing they were found from changed.

``int_calls`` points the model's own ``int``/``len``/``max``/``min`` calls at stand-ins while an export traces;
which functions are the model's own is a walk: the methods of its modules' classes and, three calls deep, the
functions and classes they reach by global name (``helper(...)``, ``utils.helper(...)``), leaving torch's,
numpy's and onnx_compat's own code alone. On a transformers model that walk visits ~900 functions (the
``PreTrainedModel`` family), 10-20 ms of every export of a model whose bare export takes 0.1-0.4 s (issue #50).

So each walk is kept with everything it read (``_Reads``): every class's MRO and the values of its and its
bases' namespaces, every function's code object and the values its global names had, every module namespace
it looked into, each function's module name. The next export of a model with the same classes is served the
kept walk only when every one of those reads gives the very same object again (identity, held strongly so no
identity is reused); any difference - a method replaced, a helper rebound, a ``__code__`` swapped, a class's
bases changed - walks anew. The same values read give the same walk, so nothing is ever served stale.
"""
from __future__ import annotations

import threading
import types
import weakref
from collections import OrderedDict
from operator import attrgetter, is_
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

LIBRARIES = {"torch", "onnx_compat", "numpy", "builtins", "functools", "typing", "collections", "contextlib",
             "warnings", "math", "abc", "enum", "dataclasses", "inspect", "copy", "wrapt", "onnx", "onnxruntime"}
DEPTH = 4  # the model's methods, then three calls deep
KEPT_WALKS = 8  # walks kept (most recently used), each with the reads that validate it


class CodeMemo:
    """A value computed once per code object, keyed by its identity and held weakly: a code object never
    changes, so what is computed from it cannot go stale, and a function redefined or given a new ``__code__``
    has a new code object, which misses. An entry goes when its code object goes."""

    def __init__(self):
        self._entries: Dict[int, tuple] = {}  # id(code) -> (weak ref to code, value)

    def get(self, code: types.CodeType, make: Callable[[types.CodeType], object]):
        key = id(code)
        found = self._entries.get(key)
        if found is not None and found[0]() is code:
            return found[1]
        value = make(code)
        self._entries[key] = (weakref.ref(code, lambda ref, key=key: self._forget(key, ref)), value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _forget(self, key: int, ref) -> None:
        if self._entries.get(key, (None,))[0] is ref:
            del self._entries[key]


_NAMES = CodeMemo()


def names_of(code: types.CodeType) -> Tuple[str, ...]:
    """The global and attribute names ``code`` and its nested code objects load, sorted (memoised)."""
    return _NAMES.get(code, _names)


def _names(code: types.CodeType) -> Tuple[str, ...]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(names_of(const))
    return tuple(sorted(names))


class _Reads:
    """What one walk read; ``holds()``: every read gives the same objects again (``freeze`` first)."""

    def __init__(self):
        self.classes: Dict[int, tuple] = {}  # id(cls) -> (cls, its __mro__, each namespace's values, functions)
        self.functions: List[tuple] = []  # (fn, its code)
        self.names: Dict[int, Tuple[dict, Set[str]]] = {}  # id(namespace) -> (namespace, the names read in it)
        self.modules: Dict[int, tuple] = {}  # id(globals) -> (globals, its __name__)

    def read(self, namespace: dict, names) -> tuple:
        """The values of ``names`` in ``namespace`` (a function's globals, a module's), recorded."""
        self.names.setdefault(id(namespace), (namespace, set()))[1].update(names)
        return tuple(map(namespace.get, names))

    def freeze(self) -> None:
        """The reads as flat tuples ``holds`` checks in a few passes (the values read again now, once: the
        walk has not changed them)."""
        classes = list(self.classes.values())
        self._classes = tuple(c[0] for c in classes), tuple(c[1] for c in classes)
        namespaces = {id(k): k for c in classes for k in c[1]}
        self._namespaces = tuple(namespaces.values()), tuple(map(_values, namespaces.values()))
        self._codes = tuple(f for f, _ in self.functions), tuple(c for _, c in self.functions)
        self._names = [(namespace, tuple(names), tuple(map(namespace.get, names)))
                       for namespace, names in self.names.values()]
        self._modules = tuple(m[0] for m in self.modules.values()), tuple(m[1] for m in self.modules.values())

    def holds(self) -> bool:
        classes, mros = self._classes
        if not all(map(is_, map(_MRO, classes), mros)) or not all(map(is_, map(_CODE, self._codes[0]),
                                                                            self._codes[1])):
            return False
        klasses, values = self._namespaces
        if not all(map(_same_functions, map(_values, klasses), values)):
            return False
        if not all(_same_globals(tuple(map(namespace.get, names)), then) for namespace, names, then in self._names):
            return False
        return all(map(is_, (namespace.get("__name__") for namespace in self._modules[0]), self._modules[1]))


_MRO, _CODE = attrgetter("__mro__"), attrgetter("__code__")


def _values(klass: type) -> tuple:
    return tuple(vars(klass).values())


def _same_functions(now: tuple, then: tuple) -> bool:
    """Values of which only the model's functions count (a class's namespace, a module's names): the same
    objects, or where one differs, the same function of the model or none on both sides. A library function
    counts as none: the walk never enters it, and ``patched()`` swaps proxies into torch's classes and modules
    at every export."""
    if len(now) != len(then):
        return False
    return all(map(is_, now, then)) or all(a is b or _own(a) is _own(b) for a, b in zip(now, then))


def _same_globals(now: tuple, then: tuple) -> bool:
    """A function's global names: a module or class must be the same object (the walk enters it); any other
    value counts by its function of the model, as in ``_same_functions``."""
    if len(now) != len(then):
        return False
    return all(map(is_, now, then)) or all(a is b or (not isinstance(a, _ENTERED) and not isinstance(b, _ENTERED)
                                                     and _own(a) is _own(b)) for a, b in zip(now, then))


_ENTERED = (types.ModuleType, type)


def _own(value) -> Optional[types.FunctionType]:
    """The model's function ``value`` stands for (as ``_function`` finds it), None for a library's or none."""
    fn = _function(value)
    if fn is None:
        return None
    namespace = getattr(fn, "__globals__", None)
    return None if namespace is not None and \
        (namespace.get("__name__") or "").split(".")[0] in LIBRARIES else fn


# (the classes, id of the root function) -> (the functions found, the reads, the root function or None); the
# reads hold what they read strongly (classes, functions, namespaces' values) until the walk is dropped
_WALKS: "OrderedDict[tuple, tuple]" = OrderedDict()
_LOCK = threading.Lock()


def functions_of(root) -> List[types.FunctionType]:
    """The Python functions ``root`` (a module, or a function) may run that are not a library's: the kept walk
    of the same classes when every read it made gives the same objects again, else a new walk."""
    if isinstance(root, torch.nn.Module):
        classes, function = frozenset(type(m) for m in root.modules()), None
    else:
        classes, function = frozenset({type(root)}), root if isinstance(root, types.FunctionType) else None
    key = (classes, id(function))
    with _LOCK:
        kept = _WALKS.get(key)
        if kept is not None and kept[2] is function and kept[1].holds():
            _WALKS.move_to_end(key)
            return list(kept[0])
        reads = _Reads()
        found = _walk(classes, function, reads)
        reads.freeze()
        _WALKS[key] = (found, reads, function)
        while len(_WALKS) > KEPT_WALKS:
            _WALKS.popitem(last=False)
        return list(found)


def forget_walks() -> None:
    """Drops the kept walks (and the strong references their reads hold)."""
    _WALKS.clear()


def _walk(classes, function, reads: _Reads) -> List[types.FunctionType]:
    start = [f for cls in classes for f in _methods(cls, reads)]
    if function is not None:
        start.append(function)
    seen: Set[int] = set()
    found, frontier = [], start
    for _ in range(DEPTH):
        following = []
        for fn in frontier:
            if id(fn) in seen or _is_library(fn, reads):
                continue
            seen.add(id(fn))
            found.append(fn)
            following += [f for f in _reached(fn, reads) if id(f) not in seen]
        frontier = following
    return found


def _is_library(fn, reads: _Reads) -> bool:
    namespace = getattr(fn, "__globals__", None)
    if namespace is None:
        return False
    name = namespace.get("__name__")
    reads.modules.setdefault(id(namespace), (namespace, name))
    return (name or "").split(".")[0] in LIBRARIES


def _methods(cls: type, reads: _Reads) -> List[types.FunctionType]:
    """The functions of ``cls`` and its bases (methods, static and class methods, property getters); each
    class listed once per walk, its namespaces' values kept in ``reads``."""
    kept = reads.classes.get(id(cls))
    if kept is None:
        mro = cls.__mro__
        values = tuple(map(_values, mro))
        functions = [f for namespace in values for f in map(_function, namespace) if f is not None]
        kept = reads.classes[id(cls)] = (cls, mro, values, functions)
    return kept[3]


def _function(value) -> Optional[types.FunctionType]:
    if value is None or (type(value) is types.FunctionType and "__func__" not in value.__dict__
                         and "fget" not in value.__dict__):
        return value  # the common cases, without the two getattr below (it runs ~20k times a walk)
    value = getattr(value, "__func__", value)  # staticmethod, classmethod
    value = getattr(value, "fget", value)  # property
    return value if isinstance(value, types.FunctionType) else None


def _reached(fn: types.FunctionType, reads: _Reads) -> List[types.FunctionType]:
    names = names_of(fn.__code__)
    values = reads.read(fn.__globals__, names)
    reads.functions.append((fn, fn.__code__))
    out = []
    for name, value in zip(names, values):
        if isinstance(value, types.ModuleType):
            # the module's own namespace, not getattr: a lazily loading module (lazy_loader, a module
            # __getattr__) would import an optional dependency the model never calls, and fail the export
            out += _in_module(vars(value), tuple(n for n in names if n != name), reads)
        elif isinstance(value, type):
            out += _methods(value, reads)
        else:
            value = _function(value)
            if value is not None:
                out.append(value)
    return out


def _in_module(namespace: dict, names: Tuple[str, ...], reads: _Reads) -> List[types.FunctionType]:
    return [f for f in map(_function, reads.read(namespace, names)) if f is not None]
