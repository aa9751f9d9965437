"""A folder written again: the files of its earlier export that the new one does not write are its own to remove.

Exporting ``kind="ctc"`` into a folder that holds a ``stateful`` export would
leave ``state-initializer.onnx`` and ``state-updater.onnx`` beside the new
config: stale graphs a reader takes for part of the new scorer. The folder's
earlier ``report.json`` says which files that export wrote; those the new
export does not write again are removed once it is written (a failed export
leaves the folder as it was). A file with a label scorer's name that no
earlier report names may be the user's own: the folder is refused before
any work rather than a foreign file deleted or left to mislead.
"""
from __future__ import annotations

import json
import os
from typing import List, Sequence

from .errors import LabelScorerError
from .rasr_specs import KINDS, graphs_of

REPORT_FILE = "report.json"


def _report_files(folder: str) -> List[str]:
    """The files the folder's earlier report names inside the folder (none without a readable report)."""
    try:
        with open(os.path.join(folder, REPORT_FILE), encoding="utf-8") as fh:
            files = json.load(fh).get("files", {})
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(files, dict):
        return []
    return [os.path.abspath(p) for p in files.values()
            if isinstance(p, str) and os.path.dirname(os.path.abspath(p)) == folder]


def earlier_files(folder: str, kind: str) -> List[str]:
    """The files an earlier export wrote into ``folder`` (from its report.json); refused: a label scorer's
    graph file the new export will not write and no earlier report names (it may be the user's own)."""
    if not os.path.isdir(folder):
        return []
    own = _report_files(folder)
    writes = {f"{g}.onnx" for g in graphs_of(kind)}
    known = {f"{g}.onnx" for k in KINDS for g in graphs_of(k)}
    foreign = sorted(n for n in os.listdir(folder) if n in known - writes
                     and os.path.join(folder, n) not in own)
    if foreign:
        raise LabelScorerError(f"the folder {folder!r} holds {foreign}, which this {kind} export does not write and "
                               f"no report.json of an earlier export there names: left beside the new "
                               "label-scorer.config they would be read as part of it, and they may be yours; "
                               "move them or choose another folder", tensor=foreign[0], rule="folder holds no "
                               "stale graphs")
    return own


def remove_stale(folder: str, earlier: Sequence[str], written: Sequence[str]) -> List[str]:
    """Remove the earlier export's files that were not written again; return their paths."""
    keep = {os.path.abspath(p) for p in written} | {os.path.join(folder, REPORT_FILE)}
    removed = []
    for path in earlier:
        if path not in keep and os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    return removed
