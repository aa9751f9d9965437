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

from .errors import LabelScorerError
from .rasr_specs import KINDS, RELEASES, graphs_of, selector

SECTION = "[*.label-scorer]"


def io_maps(kind: str, names: Mapping[str, Mapping[str, str]]) -> Dict[str, Dict[str, str]]:
    """``{graph: {spec key: graph I/O name}}`` for the keys the graphs have (``names`` from the builder)."""
    return {graph: dict(names.get(graph, {})) for graph in graphs_of(kind)}


def check_value(value: str, what: str, graph: Optional[str] = None, tensor: Optional[str] = None) -> str:
    """A value RASR's configuration reads back as written: ``#`` starts a comment (``out/f#1`` is read as
    ``out/f``), whitespace ends or splits it, ``$(name)`` is a reference RASR expands. ``what`` names it."""
    culprit = next((c for c in ("#", "$(") if c in value), None)
    if culprit is None and any(ch.isspace() for ch in value):
        culprit = "whitespace"
    if culprit is not None:
        raise LabelScorerError(f"{what} {value!r} holds {culprit!r}: RASR's configuration would not read it back "
                               "as written ('#' starts a comment, whitespace ends the value, '$(' is a reference "
                               "it expands); rename it", graph=graph, tensor=tensor or what, rule="RASR config value")
    return value


def fragment(kind: str, release: str, folder: str, maps: Mapping[str, Mapping[str, str]],
             settings: Mapping[str, str], search: List[str]) -> str:
    """The fragment's text: one ``key = value`` per line under ``[*.label-scorer]``; files by absolute path."""
    lines = [f"# label scorer written by onnx_compat.export_label_scorer for {RELEASES[release]}",
             f"# decoder type {KINDS[kind]['type']}; the search that uses it:"]
    lines += [f"#   {line}" for line in search]
    lines += [SECTION, "type = encoder-decoder", "encoder.type = onnx", f"decoder.type = {KINDS[kind]['type']}"]
    for graph in graphs_of(kind):
        sel = selector(kind, graph)
        lines.append(f"{sel}.session.file = {check_value(os.path.join(folder, graph + '.onnx'), 'folder', graph)}")
        lines += [f"{sel}.io-map.{key} = {check_value(name, f'io-map.{key}', graph, name)}"
                  for key, name in maps.get(graph, {}).items()]
    lines += [f"decoder.{key} = {check_value(value, key)}" for key, value in settings.items()]
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
