"""``onnx-compat inspect MODEL.onnx``: ``describe()`` and the RASR check, as text or JSON."""
from __future__ import annotations

import argparse
import json
from typing import Dict, List, Optional

from onnx_compat.cli_paths import Files
from onnx_compat.errors import UsageError


def add_parser(sub) -> argparse.ArgumentParser:
    i = sub.add_parser("inspect", help="I/O, dims, ops, auto_pad, metadata and RASR findings")
    i.add_argument("onnx")
    i.add_argument("--features", default="data")
    i.add_argument("--features-size", default="data:size1")
    i.add_argument("--output", default="output")
    i.add_argument("--dynamic", action="append", metavar="NAME:AXIS",
                   help="a dim meant to be dynamic (default: from onnx_compat's metadata)")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    return i


def dynamic(items: Optional[List[str]]) -> Optional[Dict[str, Dict[int, str]]]:
    """``--dynamic NAME:AXIS`` as ``describe``'s ``{name: {axis: label}}``."""
    if not items:
        return None
    wanted: dict = {}
    for item in items:
        name, sep, axis = item.rpartition(":")
        if not sep or not name or not axis.isdigit():
            raise UsageError(f"--dynamic {item!r}: expected NAME:AXIS, e.g. data:1", option="--dynamic")
        wanted.setdefault(name, {})[int(axis)] = f"{name}:{axis}"
    return wanted


def text(info: dict) -> str:
    lines = [f"opset    {info['opset']}"]
    lines += [f"input    {v['name']} {v['dtype']}{v['dims']}" for v in info["inputs"]]
    lines += [f"output   {v['name']} {v['dtype']}{v['dims']}" for v in info["outputs"]]
    lines.append(f"nodes    {info['nodes']}  auto_pad {len(info['auto_pad'])}")
    lines.append("ops      " + ", ".join(f"{k} {n}" for k, n in info["ops"].items()))
    lines += [f"meta     {k} = {v}" for k, v in info["metadata"].items()]
    rasr = info["rasr"]
    lines.append("rasr     " + ("ok, fits " + "/".join(rasr["roles"]) if rasr["ok"] else "; ".join(rasr["findings"])))
    lines += [f"finding  {f}" for f in info["findings"]]
    return "\n".join(lines)


def files(args: argparse.Namespace) -> Files:
    """``inspect`` writes nothing (``--json`` prints); it reads the model."""
    return Files().read(args.onnx, "onnx", "the model inspected")


def run(args: argparse.Namespace) -> int:
    from onnx_compat.contracts.rasr import check_rasr
    from onnx_compat.errors import ArgumentError
    from onnx_compat.graph import describe, load
    proto = load(args.onnx)  # a missing or damaged file is named here
    try:
        info = describe(proto, dynamic=dynamic(args.dynamic))
    except ArgumentError as exc:  # a NAME:AXIS the graph does not have is a typo on the command line
        raise UsageError(f"--dynamic {exc.value}: {exc}", option="--dynamic") from None
    info["rasr"] = check_rasr(proto, features=args.features, features_size=args.features_size or None,
                              output=args.output).to_dict()
    print(json.dumps(info, indent=2) if args.json else text(info))
    return 0
