"""RASR's rules as one contract among the others (the checks themselves are ``check_rasr``).

RASR maps names through its io-map, so the contract has no fixed ports: the
features, their lengths and the output are the first input, the first
input's lengths (when the graph has a second input) and the first output,
unless ``options`` name them (``check_rasr``'s keyword arguments).
"""
from __future__ import annotations

from typing import List

from .rasr import check_rasr
from .base import Context, Contract, Finding
from .native import NativeRasrConsumer


def rasr_rules(ctx: Context) -> List[Finding]:
    names = {"features": ctx.inputs[0]["name"],
             "features_size": ctx.inputs[1]["name"] if len(ctx.inputs) > 1 else None,
             "output": ctx.outputs[0]["name"]}
    names.update(ctx.options)
    check = check_rasr(ctx.proto, **names)
    if check.ok:
        ctx.notes.append("RASR roles: " + ", ".join(check.roles()))
    return [Finding("RASR", "its rules to hold", line) for line in check.findings]


RASR = Contract(
    name="rasr",
    consumer="RASR (onnx-feature-scorer, onnx-forward, the onnx encoder)",
    inputs=(),
    outputs=(),
    exact_inputs=False,
    probes=(rasr_rules,),
    consumers=(NativeRasrConsumer(),),
)
