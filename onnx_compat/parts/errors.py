"""What goes wrong in a multi-graph export, with the graph, tensor and rule as fields."""
from __future__ import annotations

from typing import Optional

from onnx_compat.errors import OnnxCompatError


class GraphContractError(OnnxCompatError, ValueError):
    """One graph of a multi-graph model breaks a rule; raised before anything is written.

    ``graph``: the part's name (``"state-updater"``); ``tensor``: the input, output or state at fault;
    ``rule``: the rule broken, in a few words (``"state dims identical in every graph"``)."""

    def __init__(self, message: str, *, graph: Optional[str] = None, tensor: Optional[str] = None,
                 rule: Optional[str] = None) -> None:
        super().__init__(message)
        self.graph, self.tensor, self.rule = graph, tensor, rule
