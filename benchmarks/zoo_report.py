"""The zoo side by side: vanilla ``torch.onnx.export`` (each exporter) against
``onnx_compat.export(exporter="auto")``, one row per model, from a real run.

    python benchmarks/zoo_report.py                 # print the table
    python benchmarks/zoo_report.py --write docs/models.md   # and replace it there

``docs/models.md`` holds the table between ``<!-- zoo:begin -->`` and ``<!-- zoo:end -->``.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import onnx
import torch

from onnx_compat import check_rasr

from onnx_compat import export
from onnx_compat.models.zoo import ZOO
from onnx_compat.pipeline.vanilla import vanilla_export

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_block  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/models.md"}

BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"


def run_one(name: str) -> dict:
    job = ZOO[name]()
    row = {"model": name}
    for exporter in ("torchscript", "dynamo"):
        row[exporter] = str(vanilla_export(job["model"], job["inputs"], job["outputs"], exporter))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        t0 = time.perf_counter()
        report = export(job["model"], path, job["inputs"], job["outputs"], exporter="auto")
        row["seconds"] = time.perf_counter() - t0
        rasr = check_rasr(path)
    row.update(exporter=report.exporter, nodes=report.nodes, max_err=report.max_abs_err,
               rasr="fits " + "/".join(rasr.roles()) if rasr.ok else "; ".join(rasr.findings))
    return row


def table(rows) -> str:
    lines = ["| model | vanilla TorchScript | vanilla dynamo | onnx_compat exporter | nodes | max abs err | RASR |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["model"], r["torchscript"], r["dynamo"], r["exporter"], str(r["nodes"]), f"{r['max_err']:.1e}",
                 r["rasr"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    return (f"torch {torch.__version__}, onnx {onnx.__version__}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs")


def write_into(page: str, text: str) -> None:
    write_block(page, text, BEGIN, END)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only models whose name contains this (repeatable)")
    add_write_option(parser, "zoo", "docs/models.md")
    args = parser.parse_args(argv)
    names = [n for n in ZOO if not args.only or any(o in n for o in args.only)]
    rows = []
    for name in names:
        rows.append(run_one(name))
        print(f"{name}: {rows[-1]['exporter']} in {rows[-1]['seconds']:.1f}s", flush=True)
    text = (table(rows) + f"\n\nMade by `python benchmarks/zoo_report.py --write docs/models.md` on {machine()}. "
            "Vanilla: `torch.onnx.export` with the same names and dynamic dims, no patches, then ONNX Runtime "
            "against eager at three shapes the export never saw.")
    print(text)
    if args.write:
        write_into(args.write, text)
    return rows


if __name__ == "__main__":
    main()
