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

from .graph import load, value_info


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


def _batch_ok(dim) -> bool:
    return isinstance(dim, str) or dim == 1


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
        d = feat["dims"]
        if feat["dtype"] != "float":
            f.append(f"features {features!r}: dtype must be float32, is {feat['dtype']}")
        if len(d) != 3:
            f.append(f"features {features!r}: rank must be 3 [B, T, F], is {len(d)} {d}")
        else:
            if not _batch_ok(d[0]):
                f.append(f"features {features!r}: batch dim must be symbolic or 1, is {d[0]}")
            if not isinstance(d[1], str):
                f.append(f"features {features!r}: time dim must be symbolic, is {d[1]}")
            if not isinstance(d[2], int):
                f.append(f"features {features!r}: feature dim must be static, is {d[2]!r}")
            elif feature_dim is not None and d[2] != feature_dim:
                f.append(f"features {features!r}: feature dim is {d[2]}, RASR's feature dim is {feature_dim}")

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
    for name in inputs:
        if name not in mapped:
            f.append(f"input {name!r} is not mapped (io-map) and RASR never feeds unmapped inputs")

    out = outputs.get(output)
    if out is None:
        f.append(f"output: the graph has no output {output!r} (outputs: {list(outputs)})")
    else:
        d = out["dims"]
        if out["dtype"] != "float":
            f.append(f"output {output!r}: dtype must be float32, is {out['dtype']}")
        if len(d) != 3:
            f.append(f"output {output!r}: rank must be 3 [B, T', C], is {len(d)} {d}")
        else:
            if not _batch_ok(d[0]):
                f.append(f"output {output!r}: batch dim must be symbolic or 1, is {d[0]}")
            if not isinstance(d[2], int):
                f.append(f"output {output!r}: class dim must be static, is {d[2]!r}")
            if isinstance(d[1], str):
                check.encoder = not f
                check.feature_scorer = not f and feat is not None and len(feat["dims"]) == 3 and d[1] == feat["dims"][1]
            else:
                f.append(f"output {output!r}: time dim must be symbolic, is {d[1]}")
    if f:
        check.encoder = check.feature_scorer = False
    return check
