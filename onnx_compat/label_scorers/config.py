"""The RASR config fragment of a label scorer folder: every ``io-map`` entry, every file, written and read back.

RASR has no default I/O names: a graph's tensors are fed only if
``<model>.io-map.<spec name>`` names them. The fragment is written from
the same table the loader emulation checks (``rasr_specs``), and the RASR
emulator that proves the decode reads the fragment back from disk, so a key
the fragment gets wrong fails the proof rather than a recognition run.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional

from .rasr_specs import KINDS, RELEASES, graphs_of, selector

SECTION = "[*.label-scorer]"


def io_maps(kind: str, names: Mapping[str, Mapping[str, str]]) -> Dict[str, Dict[str, str]]:
    """``{graph: {spec key: graph I/O name}}`` for the keys the graphs have (``names`` from the builder)."""
    return {graph: dict(names.get(graph, {})) for graph in graphs_of(kind)}


def fragment(kind: str, release: str, folder: str, maps: Mapping[str, Mapping[str, str]],
             settings: Mapping[str, str], search: List[str]) -> str:
    """The fragment's text: one ``key = value`` per line under ``[*.label-scorer]``; files by absolute path."""
    lines = [f"# label scorer written by onnx_compat.export_label_scorer for {RELEASES[release]}",
             f"# decoder type {KINDS[kind]['type']}; the search that uses it:"]
    lines += [f"#   {line}" for line in search]
    lines += [SECTION, "type = encoder-decoder", "encoder.type = onnx", f"decoder.type = {KINDS[kind]['type']}"]
    for graph in graphs_of(kind):
        sel = selector(kind, graph)
        lines.append(f"{sel}.session.file = {os.path.join(folder, graph + '.onnx')}")
        lines += [f"{sel}.io-map.{key} = {name}" for key, name in maps.get(graph, {}).items()]
    lines += [f"decoder.{key} = {value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def parse(text: str) -> Dict[str, str]:
    """The fragment's ``{key: value}`` under ``[*.label-scorer]`` (comments and other sections skipped)."""
    values, inside = {}, False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            inside = line == SECTION
            continue
        if inside and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            values[key] = value
    return values


def graph_settings(values: Mapping[str, str], sel: str) -> Dict[str, object]:
    """One graph's ``session.file`` and ``io-map`` as read from a parsed fragment (what RASR would see)."""
    prefix = sel + ".io-map."
    return {"file": values.get(sel + ".session.file"),
            "io-map": {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix) and v}}


def setting(values: Mapping[str, str], key: str, default: Optional[str] = None) -> Optional[str]:
    return values.get("decoder." + key, default)
