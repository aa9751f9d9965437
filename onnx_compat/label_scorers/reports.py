"""The reports a label scorer's export returns and writes into its folder, and the folder's file names.

``LabelScorerReport`` (``api.py``'s kinds) and ``StateManagedReport`` (``state_managed.py``,
``full_context.py``) live here, below the modules that fill them: ``api.py`` dispatches the state-managed
and full-context kinds to their modules, which read the report and these names; kept in ``api.py`` and
``state_managed.py`` they made the four modules import each other in a circle.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List

from .folders import REPORT_FILE  # noqa: F401 - the one name of the report file (folders.py reads earlier ones)

CONFIG_FILE = "label-scorer.config"


@dataclass
class LabelScorerReport:
    folder: str
    kind: str
    rasr_type: str
    release: str
    files: Dict[str, str] = field(default_factory=dict)
    config: str = ""
    loader: List[str] = field(default_factory=list)  # the rule sets each graph passed
    steps: dict = field(default_factory=dict)  # per graph: what its steps did (RASR metadata and rules, stamped dims)
    graphs: dict = field(default_factory=dict)  # per graph: exporter, I/O, verification (parts' report)
    states: dict = field(default_factory=dict)
    decodes: List[dict] = field(default_factory=list)
    row_max_abs_err: float = 0.0  # the largest difference of a batched row from its context scored alone
    rows_checked: int = 0  # rows of batched runs compared with their context run alone
    uses_encoder_lengths: Dict[str, bool] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # what the proof could not show (a trivial decode)
    removed: List[str] = field(default_factory=list)  # the folder's files of an earlier export not written again
    timings: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class StateManagedReport(LabelScorerReport):
    manager: str = ""
    layout: str = ""  # "cache" (one position per label), "recurrent" ([B, S]) or "recurrent-stacked"
    notes: List[str] = field(default_factory=list)  # what RASR would do wrong and what was written instead
    mixed_batch: dict = field(default_factory=dict)  # hypotheses of different prefix lengths in one run
