"""What can be wrong with a label scorer's graphs, named by graph, tensor and rule."""
from __future__ import annotations

from onnx_compat.parts.errors import GraphContractError


class LabelScorerError(GraphContractError):
    """A label scorer RASR would refuse, crash on, or decode wrongly with; raised before anything is written.

    ``graph``: ``encoder``, ``state-initializer``, ``state-updater``, ``scorer`` (or ``None`` for an
    argument); ``tensor``: the I/O name, state or argument; ``rule``: the rule broken."""


class DecodeMismatch(LabelScorerError):
    """The search over the written graphs (called as RASR calls them) decoded other labels than the same
    search over the PyTorch callables, or costs off by more than the tolerance."""
