"""RASR's validation rules for an ONNX acoustic model.

RASR (onnx-feature-scorer, onnx-forward, the onnx encoder) maps model names
through ``io-map.features``, ``io-map.features-size`` and ``io-map.output``
and refuses a model that breaks any of these rules. Checking them here finds
the problem at export time instead of in the decoder's log.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Union

import onnx

from onnx_compat.graph import load, value_info


@dataclass
class RasrCheck:
    findings: List[str] = field(default_factory=list)
    feature_scorer: bool = False  # output time equals input time (T' = T)
    encoder: bool = False         # any symbolic output time

    @property
    def ok(self) -> bool:
        return not self.findings

    def roles(self) -> List[str]:
        return [r for r, fits in (("feature-scorer", self.feature_scorer), ("encoder", self.encoder)) if fits]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "findings": self.findings, "roles": self.roles()}


def _state_pairs(proto: onnx.ModelProto) -> dict:
    """RASR's stateful-model convention (``STATE_<input>`` = ``<output>`` in the metadata, which streaming
    exports write): each such input is fed from its paired output of the previous call, not via io-map."""
    return {p.key[len("STATE_"):]: p.value for p in proto.metadata_props if p.key.startswith("STATE_")}


def _batch_ok(dim) -> bool:
    return isinstance(dim, str) or dim == 1


def _sequence_rules(role: str, name: str, info: dict, last: str) -> List[str]:
    """The rules features and output share: float32 ``[B, T, X]``, B symbolic or 1,
    T symbolic, X (``last``) static."""
    d, f = info["dims"], []
    if info["dtype"] != "float":
        f.append(f"{role} {name!r}: dtype must be float32, is {info['dtype']}")
    if len(d) != 3:
        f.append(f"{role} {name!r}: rank must be 3 [B, T, {last[0].upper()}], is {len(d)} {d}")
        return f
    if not _batch_ok(d[0]):
        f.append(f"{role} {name!r}: batch dim must be symbolic or 1, is {d[0]}")
    if not isinstance(d[1], str):
        f.append(f"{role} {name!r}: time dim must be symbolic, is {d[1]}")
    if not isinstance(d[2], int):
        f.append(f"{role} {name!r}: {last} dim must be static, is {d[2]!r}")
    return f


def check_rasr(model: Union[str, os.PathLike, onnx.ModelProto], features: str = "data",
               features_size: Optional[str] = "data:size1", output: str = "output",
               feature_dim: Optional[int] = None) -> RasrCheck:
    """One finding per broken rule; ``features_size=None`` means no lengths input is mapped."""
    proto = load(model)
    inputs = {v.name: value_info(v) for v in proto.graph.input}
    outputs = {v.name: value_info(v) for v in proto.graph.output}
    check = RasrCheck()
    f = check.findings

    feat = inputs.get(features)
    if feat is None:
        f.append(f"features: the graph has no input {features!r} (inputs: {list(inputs)})")
    else:
        f += _sequence_rules("features", features, feat, "feature")
        width = feat["dims"][2] if len(feat["dims"]) == 3 else None
        if feature_dim is not None and isinstance(width, int) and width != feature_dim:
            f.append(f"features {features!r}: feature dim is {width}, RASR's feature dim is {feature_dim}")

    if features_size is not None:
        size = inputs.get(features_size)
        if size is None:
            f.append(f"features-size: the graph has no input {features_size!r}")
        else:
            if size["dtype"] != "int32":
                f.append(f"features-size {features_size!r}: dtype must be int32, is {size['dtype']}")
            if len(size["dims"]) != 1 or not isinstance(size["dims"][0], str):
                f.append(f"features-size {features_size!r}: must be [B] with B symbolic, is {size['dims']}")
    mapped = {features, features_size}
    states = _state_pairs(proto)
    for name, paired in states.items():
        if name not in inputs:
            f.append(f"metadata 'STATE_{name}' names input {name!r}, which the graph does not have")
        elif paired not in outputs:
            f.append(f"state {name!r}: metadata 'STATE_{name}' names output {paired!r}, which the graph does not "
                     f"have (outputs: {list(outputs)})")
    for name in inputs:
        if name not in mapped and name not in states:
            f.append(f"input {name!r} is not mapped (io-map), nor a state (STATE_{name} metadata), and RASR never "
                     "feeds unmapped inputs")

    out = outputs.get(output)
    if out is None:
        f.append(f"output: the graph has no output {output!r} (outputs: {list(outputs)})")
    else:
        f += _sequence_rules("output", output, out, "class")
    if not f:
        check.encoder = True
        check.feature_scorer = out["dims"][1] == feat["dims"][1]
    return check
