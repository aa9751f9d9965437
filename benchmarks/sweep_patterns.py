"""Names the root-cause pattern of each sweep error: the code form that stops an exporter.

Each pattern is a regex over the one-line error plus the library line it came
from (``sweep_run.library_frame``); the first match names it. A new error that no
regex knows stays "unclassified: <error>" so it shows up in the ranking.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

# (name, regex over "error || where"); first match wins, so the specific ones come first
PATTERNS: Tuple[Tuple[str, str], ...] = (
)


def pattern_of(error: str, where: str = "") -> str:
    text = f"{error} || {where}"
    for name, regex in PATTERNS:
        if re.search(regex, text, re.S):
            return name
    return "unclassified: " + error[:90]


def _failures(result: dict) -> List[Tuple[str, str, str]]:
    """(step, error, where) of every failed step; export(auto)'s attempts one by one."""
    out = []
    for step, o in result.get("steps", {}).items():
        if step == "auto":
            label = "auto" if o["stage"] != "ok" else "auto-fallback"
            for exporter, error in (o.get("attempts") or {}).items():
                out.append((f"{label}:{exporter}", error, o.get("where", "")))
            if o["stage"] != "ok" and not o.get("attempts"):
                out.append(("auto", o.get("error", ""), o.get("where", "")))
        elif o["stage"] != "ok":
            out.append((step, o.get("error", ""), o.get("where", "")))
    return out


def classify(result: dict) -> dict:
    """Adds ``pattern_steps`` ({pattern: [steps]}) and ``patterns`` (for the table) to a sweep row."""
    found: Dict[str, List[str]] = {}
    if "build" in result:
        found.setdefault("does not build: " + result["build"]["error"][:80], []).append("build")
    for step, error, where in _failures(result):
        found.setdefault(pattern_of(error, where), []).append(step)
    result["pattern_steps"] = found
    result["patterns"] = [f"{p} ({', '.join(_short_steps(s))})" for p, s in found.items()]
    return result


_SHORT = {"vanilla_ts": "vTS", "vanilla_dynamo": "vDyn", "patched_ts": "pTS", "patched_dynamo": "pDyn",
          "auto:dynamo": "auto-Dyn", "auto:torchscript": "auto-TS", "auto-fallback:dynamo": "auto-Dyn→TS",
          "auto-fallback:torchscript": "auto-TS", "auto": "auto"}


def _short_steps(steps: List[str]) -> List[str]:
    return [_SHORT.get(s, s) for s in steps]
