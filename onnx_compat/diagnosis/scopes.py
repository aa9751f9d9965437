"""The user's module behind a name an exporter wrote: one mapper for every form.

Exporters name what they trace after the module that was running, each in
its own form:

* TorchScript's trace scopes (``Adapter::/pkg.Model::model/pkg.Seq::encoder/...``),
  and the ONNX node names made from them (``/model/layers.0/conv/net/net.3/Mul_2``):
  each part is named relative to the module that was *called* last, so a
  Sequential's child reads ``net.3`` below ``net`` and a ModuleList's child
  ``layers.0`` (the list itself is never called). The path is rebuilt part by
  part against ``named_modules()``.
* dynamo's ``nn_module_stack`` (``L['self'].model._modules['encoder']``) and
  node metadata ``pkg.torch.onnx.name_scopes`` (full dotted paths).

Every path is returned relative to the user's model: the ``IOAdapter``'s
attribute (``model``) that wraps it during an export is taken off here.
"""
from __future__ import annotations

import ast
import re
from typing import Collection, Optional, Sequence

import onnx

from onnx_compat.pipeline.adapter import IOAdapter

ADAPTER = IOAdapter.MODEL_ATTR


def user_path(path: str) -> Optional[str]:
    """``model.encoder.1`` -> ``encoder.1``; ``model`` -> ``""``; a path outside the adapter -> None."""
    if path == ADAPTER:
        return ""
    return path[len(ADAPTER) + 1:] if path.startswith(ADAPTER + ".") else None


def resolve(parts: Sequence[str], known: Collection[str], strict: bool = True) -> Optional[str]:
    """The dotted path of parts each named relative to the last module resolved. ``strict``: a part
    that names no module makes the whole path unknown (None); else it is skipped."""
    path = ""
    for part in parts:
        pieces = part.split(".")
        for start in range(len(pieces)):
            candidate = ".".join(([path] if path else []) + pieces[start:])
            if candidate in known:
                path = candidate
                break
        else:
            if strict:
                return None
    return path


def of_jit_scope(scope: str, known: Collection[str]) -> str:
    """A TorchScript trace scope as the user's module path (best effort: unresolved parts are skipped)."""
    last = scope.strip("/").rsplit("/", 1)[-1]
    if last.startswith("__module."):  # a plain trace's form: "__module.model/__module.model.encoder/..."
        path = last[len("__module."):]
        found = user_path(path)
        return path if found is None else found
    attrs = [part.split("::", 1)[1] for part in scope.strip("/").split("/") if "::" in part]
    if attrs[:1] == [""] and len(attrs) > 1:  # the adapter itself, then its ``model``
        attrs = attrs[2:]
    return resolve(attrs, known, strict=False) or ""


def of_onnx_node(node: onnx.NodeProto, known: Collection[str]) -> Optional[str]:
    """The user's module path of an exported node (dynamo's metadata or TorchScript's node name), or None."""
    meta = {p.key: p.value for p in node.metadata_props}
    if "pkg.torch.onnx.name_scopes" in meta:  # dynamo: ['', 'model', 'model.blocks.0', ..., op], full paths
        try:
            scopes = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])
        except (ValueError, SyntaxError):
            return None
        return user_path(scopes[-2] if len(scopes) >= 2 else "")
    if not node.name.startswith("/"):
        return None
    segments = node.name.split("/")[1:-1]
    if not segments or segments[0] != ADAPTER:
        return None
    return resolve(segments[1:], known)


def of_module_stack(path: str) -> str:
    """dynamo's ``nn_module_stack`` key (``L['self'].model._modules['encoder']``) as a user path."""
    dotted = re.sub(r"^L\['self'\]\.?", "", path).replace("._modules['", ".").replace("']", "")
    found = user_path(dotted)
    return dotted if found is None else found
