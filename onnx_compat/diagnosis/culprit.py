"""Which of the user's modules a failed export points at.

An exporter says *what* failed (an op, a guard); in a 400-module model the
user needs *where*. Three sources, tried in order:

1. A Python-level error while tracing (a data-dependent guard, a refused
   argument): the innermost frame of the traceback whose ``self`` is one of the
   model's modules, with that frame's source line.
2. The TorchScript exporter failing to convert an op after tracing: the
   ``scope:`` of the node that failed, from the error's own text, or from a
   trace made again on failure (``CaptureError.scope``).
3. The dynamo exporter failing to translate a node: the node's
   ``nn_module_stack`` and ``stack_trace`` (``CaptureError.node``).

The answer is a ``Culprit``, whose line has one form:
``culprit <dotted.module.path> (<Class>): <what> [<file:line>]``.
"""
from __future__ import annotations

import os
import re
import traceback
from typing import Dict, Iterator, Optional, Tuple

import torch

from onnx_compat.diagnosis import scopes
from onnx_compat.errors import CaptureError, Culprit

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_MODELS_DIR = os.path.join(_OWN_DIR, "models", "")  # our bundled models are user code
Found = Tuple[str, str, str]  # (module path, class, source line)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _from_traceback(exc: BaseException, names: Dict[int, str]) -> Optional[Found]:
    found = None
    for error in _chain(exc):
        for frame, line in traceback.walk_tb(error.__traceback__):
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and id(owner) in names:
                found = (names[id(owner)], type(owner).__name__, f"{frame.f_code.co_filename}:{line}")
        if found:
            return found
    return None


def _class_at(path: str, modules: Dict[str, torch.nn.Module], fallback: str = "?") -> str:
    module = modules.get(path)
    return type(module).__name__ if module is not None else fallback


def _from_scope(exc: BaseException, modules: Dict[str, torch.nn.Module]) -> Optional[Found]:
    for error in _chain(exc):
        if isinstance(error, CaptureError) and error.scope:
            scope, where = error.scope  # where: "file(line): function"
            path = scopes.of_jit_scope(scope, modules)
            cls = _class_at(path, modules, scope.rsplit("/", 1)[-1].split("::")[0].rsplit(".", 1)[-1])
            return path, cls, re.sub(r"^(.*)\((\d+)\):.*$", r"\1:\2", where.strip())
        text = str(error)
        if "Caused by the value" in text:
            caused = text[text.index("Caused by the value"):]
            found = re.search(r"scope: (\S+)(?: # (\S+?:\d+)(?::\d+)?)?", caused)
            if found:
                path = scopes.of_jit_scope(found.group(1), modules)
                cls = _class_at(path, modules, found.group(1).rsplit("/", 1)[-1].split("::")[0].rsplit(".", 1)[-1])
                return path, cls, found.group(2) or ""
    return None


def _from_node(exc: BaseException) -> Optional[Found]:
    for error in _chain(exc):
        node = error.node if isinstance(error, CaptureError) else None
        if node:
            stack = list((node.get("nn_module_stack") or {}).values())
            if not stack:
                return None
            path, cls = stack[-1]
            cls = cls.rsplit(".", 1)[-1] if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
            trace = (node.get("stack_trace") or "").strip().splitlines()
            files = [t.strip() for t in trace if t.strip().startswith("File ")]
            user = [f for f in files if _TORCH_DIR not in f and (_OWN_DIR not in f or _MODELS_DIR in f)] or files
            where = user[-1].replace("File ", "").replace('", line ', ":").strip('"').split(",")[0] if user else ""
            return scopes.of_module_stack(path), cls, where
    return None


def culprit(exc: BaseException, model: torch.nn.Module, what: Optional[str] = None) -> Optional[Culprit]:
    """The module of ``model`` a failed export points at (kind "export"), or None when nothing points anywhere.

    ``what``: the failure in one line (default: the ``CaptureError``'s own line)."""
    modules = dict(model.named_modules())
    names = {id(m): name for name, m in modules.items()}
    found = _from_traceback(exc, names) or _from_node(exc) or _from_scope(exc, modules)
    if found is None:
        return None
    path, cls, where = found
    if what is None:
        what = next((e.line for e in _chain(exc) if isinstance(e, CaptureError)), f"{type(exc).__name__}: {exc}")
    what = what.split("  [Caused by the value")[0].split(" Please feel free to request support")[0]
    return Culprit("export", path, cls, what, where)
