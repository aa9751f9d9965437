"""One graph of a label scorer as a deployment step: RASR's state metadata written, its per-graph rules checked.

``export()`` runs it on each graph before anything is written
(``pipeline/steps.py``): ``before_write`` adds the metadata
``{graph I/O name: state name}`` RASR matches states by, then checks what
RASR checks or assumes of this graph alone -- its ``IOValidator`` with the
io-map the config fragment will hold, and each state's dtype and batch dim
(static 1 in the initializer, symbolic elsewhere, the other dims static).
What only the graphs together can show (the constructor's state rules, the
states alike across graphs, the decode) is checked by ``api.py`` once every
graph is made. A graph written without ``export()`` (the transducer's
constant initializer) runs the same hook.
"""
from __future__ import annotations

from typing import Dict, List, Mapping

from onnx_compat.pipeline.steps import Step

from .errors import LabelScorerError
from .loader import Finding, state_rules, validator
from .rasr_specs import KINDS, spec_of


class LabelScorerGraphStep(Step):
    name = "rasr-label-scorer"

    def __init__(self, kind: str, graph: str, io_map: Mapping[str, str], states: Mapping[str, str],
                 frames: str) -> None:
        # frames: the encoder frames' dim (``graphs.FRAMES``), passed in by ``with_steps``: graphs imports this step
        self.kind, self.graph, self.frames = kind, graph, frames
        self.io_map, self.states = dict(io_map), dict(states)
        self.checked: List[str] = []

    def before_write(self, request, report, proto) -> None:
        existing = {p.key: p for p in proto.metadata_props}
        for key, value in self.states.items():
            if key in existing:
                existing[key].value = value
            else:
                proto.metadata_props.add(key=key, value=value)
        found: List[Finding] = validator(self.graph, proto, self.io_map, spec_of(self.kind, self.graph))
        if self.graph != "encoder" and self.kind in ("stateful", "transducer"):
            found += state_rules(self.graph, proto, self.frames if self.kind == "stateful" else None)
        if found:
            raise LabelScorerError(f"graph {self.graph!r}: RASR would refuse it (or crash on it): " +
                                   "; ".join(str(f) for f in found), graph=found[0].graph, tensor=found[0].tensor,
                                   rule=found[0].rule)
        self.checked = ["validator"] + (["state metadata, dtypes and batch dims"] if self.states else [])

    def describe(self) -> Dict[str, object]:
        return {"rasr_type": "onnx" if self.graph == "encoder" else KINDS[self.kind]["type"], "graph": self.graph,
                "io-map": dict(self.io_map), "states": dict(self.states), "checked": list(self.checked)}
