"""Which of the user's modules a failed export points at.

An exporter says *what* failed (an op, a guard); in a 400-module model the
user needs *where*. Three sources, tried in order:

1. A Python-level error while tracing (a data-dependent guard, a refused
   argument): the innermost frame of the traceback whose ``self`` is one of the
   model's modules, with that frame's source line.
2. The TorchScript exporter failing to convert an op after tracing: the
   ``scope:`` of the node that failed, from the error's own text, or from a
   trace made again on failure (``exporters`` attaches it).
3. The dynamo exporter failing to translate a node: the node's
   ``nn_module_stack`` and ``stack_trace`` (``exporters`` attaches them).

The line has one form: ``culprit <dotted.module.path> (<Class>): <what>``.
"""
from __future__ import annotations

import os
import re
import traceback
from typing import Dict, Iterator, Optional, Tuple

import torch

# In the exporters the user's model is the IOAdapter's ``model`` attribute.
_ADAPTER_PREFIX = "model."
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
_MODELS_DIR = os.path.join(_OWN_DIR, "models", "")  # our bundled models are user code


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _short(path: str) -> str:
    return path[len(_ADAPTER_PREFIX):] if path.startswith(_ADAPTER_PREFIX) else ("" if path == "model" else path)


def _from_traceback(exc: BaseException, names: Dict[int, str]) -> Optional[Tuple[str, str, str]]:
    found = None
    for error in _chain(exc):
        for frame, line in traceback.walk_tb(error.__traceback__):
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and id(owner) in names:
                found = (names[id(owner)], type(owner).__name__, f"{frame.f_code.co_filename}:{line}")
        if found:
            return found
    return None


def _scope_path(scope: str, modules: Dict[str, torch.nn.Module]) -> Tuple[str, str]:
    """A TorchScript scope (``Adapter::/pkg.Model::model/pkg.Seq::encoder/pkg.Block::encoder.1/...``)
    as a dotted path of the user's model. Each part is named relative to an enclosing *called*
    module, so the path is rebuilt part by part against ``named_modules()``."""
    last = scope.strip("/").rsplit("/", 1)[-1]
    if last.startswith("__module."):  # a plain trace's form: "__module.model/__module.model.encoder/..."
        path = _short(last[len("__module."):])
        module = modules.get(path)
        return path, type(module).__name__ if module is not None else "?"
    attrs = [part.split("::", 1)[1] for part in scope.strip("/").split("/") if "::" in part]
    path = ""
    for attr in attrs[2:] if attrs[:1] == [""] and len(attrs) > 1 else attrs:
        pieces = attr.split(".")
        for k in range(len(pieces)):
            candidate = ".".join(filter(None, [path] + pieces[k:]))
            if candidate in modules:
                path = candidate
                break
    module = modules.get(path)
    cls = type(module).__name__ if module is not None else scope.rsplit("/", 1)[-1].split("::")[0].rsplit(".", 1)[-1]
    return path, cls


def _from_scope(exc: BaseException, modules: Dict[str, torch.nn.Module]) -> Optional[Tuple[str, str, str]]:
    for error in _chain(exc):
        attached = getattr(error, "onnx_compat_scope", None)
        if attached:
            scope, where = attached  # where: "file(line): function"
            return (*_scope_path(scope, modules), re.sub(r"^(.*)\((\d+)\):.*$", r"\1:\2", where.strip()))
        text = str(error)
        if "Caused by the value" in text:
            caused = text[text.index("Caused by the value"):]
            found = re.search(r"scope: (\S+)(?: # (\S+?:\d+)(?::\d+)?)?", caused)
            if found:
                return (*_scope_path(found.group(1), modules), found.group(2) or "")
    return None


def _from_node(exc: BaseException) -> Optional[Tuple[str, str, str]]:
    for error in _chain(exc):
        node = getattr(error, "onnx_compat_node", None)
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
            return _short(re.sub(r"^L\['self'\]\.?", "", path).replace("._modules['", ".").replace("']", "")), cls, where
    return None


def culprit(exc: BaseException, model: torch.nn.Module, what: str) -> Optional[str]:
    """``culprit <path> (<Class>): <what>`` for a failed export of ``model``, or None when nothing points anywhere."""
    modules = dict(model.named_modules())
    names = {id(m): name for name, m in modules.items()}
    found = _from_traceback(exc, names) or _from_node(exc) or _from_scope(exc, modules)
    if found is None:
        return None
    path, cls, where = found
    what = what.split("  [Caused by the value")[0].split(" Please feel free to request support")[0]
    return f"culprit {path or '(the model itself)'} ({cls}): {what}" + (f" [{where}]" if where else "")
