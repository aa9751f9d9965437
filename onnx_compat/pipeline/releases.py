"""Deployment targets: which ONNX Runtime release loads which opset and IR version.

C++ deployments pin an ONNX Runtime release for years; a model stamped with a
newer opset or IR version does not load there ("Unsupported model IR version:
10, max supported IR version: 9"). ``export(..., target="onnxruntime==1.16")``
exports at the newest opset that release implements and lowers the IR version
to what it reads.

``LOADS`` was measured, not copied: ``benchmarks/runtime_support.py``
installs each release's wheel from the package registry and loads a one-node
model stamped with each opset and IR version (2026-11-30, Linux x86-64). Rows
are per minor release; patch releases of one minor read the same versions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import onnx

from onnx_compat.errors import TargetError  # noqa: F401 - raised here, importable from here

from onnx_compat.graph import all_nodes


# release -> (highest opset it loads, highest IR version it loads)
LOADS: Dict[str, Tuple[int, int]] = {
    "1.15.1": (19, 9),
    "1.16.3": (19, 9),
    "1.17.3": (20, 9),
    "1.18.1": (21, 10),
    "1.19.2": (21, 10),
    "1.20.1": (21, 10),
    "1.21.1": (22, 10),
    "1.22.1": (22, 10),
    "1.23.2": (23, 11),
    "1.24.4": (25, 13),
    "1.25.1": (26, 13),
    "1.26.0": (26, 13),
    "1.27.0": (26, 13),
    "1.28.0": (26, 13),
    "1.29.0": (26, 13),
    "1.30.0": (26, 13),
    "1.31.1": (26, 13),
    "1.32.0": (28, 14),
}


@dataclass(frozen=True)
class Target:
    """An ONNX Runtime release a model must load in."""

    runtime: str
    release: str  # the measured release of that minor version
    opset: int
    ir_version: int

    def __str__(self) -> str:
        return f"{self.runtime}=={self.release} (opset <= {self.opset}, IR <= {self.ir_version})"


_SPEC = re.compile(r"^\s*onnxruntime\s*==\s*(\d+)\.(\d+)(?:\.(\d+))?\s*$")


def parse_target(text: str) -> Target:
    """``"onnxruntime==1.16"`` (or ``==1.16.3``) as a ``Target``; anything else is a ``TargetError``."""
    found = _SPEC.match(text) if isinstance(text, str) else None
    if not found:
        raise TargetError(f"unknown target {text!r}; write it as 'onnxruntime==MAJOR.MINOR', e.g. 'onnxruntime==1.16'")
    minor = f"{found.group(1)}.{found.group(2)}."
    releases = [r for r in LOADS if r.startswith(minor)]
    if not releases:
        known = ", ".join(sorted({r.rsplit('.', 1)[0] for r in LOADS}, key=lambda v: tuple(map(int, v.split(".")))))
        raise TargetError(f"target {text!r}: no measured row for onnxruntime {minor[:-1]}; known: {known} "
                          "(add one with benchmarks/runtime_support.py)")
    opset, ir = LOADS[releases[0]]
    return Target("onnxruntime", releases[0], opset, ir)


def opset_for(exporter: str, opset: Optional[int], target: Optional[Target]) -> Optional[int]:
    """The opset to ask ``exporter`` for: the user's, else the newest the target loads that the exporter
    writes (its own default at most: an older opset always loads in a newer runtime)."""
    if opset is not None or target is None:
        return opset
    import torch.onnx._constants as constants
    most = (getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 17) if exporter == "torchscript"
            else getattr(constants, "ONNX_DEFAULT_OPSET", 18))
    return min(target.opset, most)


def required_ir(proto: onnx.ModelProto) -> Tuple[int, str]:
    """The lowest IR version this model can be stamped with, and what requires it.

    The opsets set the floor (``onnx.helper.find_min_ir_version_for``); IR 10
    added metadata on nodes and functions (which the dynamo exporter writes:
    debugging info, removable) and 4-bit integers; IR 9 added float8 types.
    """
    floor = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    need, why = floor, f"opset imports {[(o.domain or 'ai.onnx', o.version) for o in proto.opset_import]}"
    types = {t.data_type for t in _tensors(proto)} | _value_types(proto)
    for ir, names in ((9, ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")),
                      (10, ("UINT4", "INT4")), (11, ("FLOAT4E2M1",))):
        used = [n for n in names if getattr(onnx.TensorProto, n, None) in types]
        if used and ir > need:
            need, why = ir, f"tensor type {used[0]}"
    if any(f.overload for f in proto.functions) and need < 10:
        need, why = 10, "an overloaded function"
    return need, why


def _tensors(proto):
    yield from proto.graph.initializer
    for node in all_nodes(proto):
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t


def _value_types(proto) -> set:
    infos = list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)
    return {v.type.tensor_type.elem_type for v in infos if v.type.HasField("tensor_type")}


def fit(proto: onnx.ModelProto, target: Optional[Target]) -> Optional[str]:
    """Make ``proto`` loadable by ``target`` in place: check its opset, lower its IR version.

    Returns what was changed (for the report), or None. Node and function
    metadata (IR 10; the dynamo exporter's stack traces) is dropped when the
    target reads an older IR. Raises ``TargetError`` when the model needs
    more than the target has.
    """
    if target is None:
        return None
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset > target.opset:
        raise TargetError(f"the model has opset {opset}; {target} implements at most opset {target.opset}")
    if proto.ir_version <= target.ir_version:
        return None
    need, why = required_ir(proto)
    if need > target.ir_version:
        raise TargetError(f"{why} needs IR version {need}; {target} reads at most IR {target.ir_version}")
    before = proto.ir_version
    if target.ir_version < 10:
        for holder in [*all_nodes(proto), *proto.functions]:
            del holder.metadata_props[:]
    proto.ir_version = target.ir_version
    return f"IR version {before} -> {target.ir_version} for {target}"
