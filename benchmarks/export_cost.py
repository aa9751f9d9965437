"""What the pipeline and the patches cost at export time, on the 12 x 256 Conformer.

    .venv/bin/python benchmarks/export_cost.py [--tiny] [--runs N] [--write docs/benchmarks.md]

Two ratios, each measured side by side in one process, runs interleaved:

- patch overhead: bare ``torch.onnx.export`` inside ``patched()`` vs outside
  (TorchScript exporter: the unpatched export of this model works there;
  target <= 1.05).
- pipeline cost: ``onnx_compat.export`` (patched export + int repair +
  cleanup + verification at three shapes + metadata + the file written) vs
  the bare export written to a file, as a user's own call does (target <= 1.5);
  for TorchScript also with ``cleanup=False``, to show what cleanup costs. For dynamo the bare export needs ``patched()`` (unpatched it fails on
  this model's SDPA mask), so that is the baseline.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time

import onnx
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import torch_export  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.capture import HAS_DYNAMO  # noqa: E402
from onnx_compat.models import conformer  # noqa: E402
from onnx_compat.spec import dim_sizes, make_inputs  # noqa: E402

NAMES = ["data", "data:size1"]
DYNAMIC = {"data": {0: "batch", 1: "time"}, "data:size1": {0: "batch"}}


def _bare(model, args, dynamo, patched, path=None):
    """Seconds of a bare ``torch.onnx.export``; with ``path``, to a file as a user's own call writes it."""
    t0 = time.perf_counter()
    with onnx_compat.patched() if patched else contextlib.nullcontext():
        proto, _ = torch_export(model, args, NAMES, DYNAMIC, dynamo=dynamo)
    if path is not None:
        onnx.save(proto, path)
    return time.perf_counter() - t0


def _pipeline(job, exporter, cleanup, tmp):
    t0 = time.perf_counter()
    report = onnx_compat.export(job["model"], os.path.join(tmp, f"{exporter}.onnx"), job["inputs"], job["outputs"],
                                exporter=exporter, cleanup=cleanup)
    return time.perf_counter() - t0, report


def _medians(fns, runs):
    """Interleaved runs of each fn (after one warm-up each); median seconds per fn."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for k, fn in enumerate(fns):
            times[k].append(fn())
    return [statistics.median(t) for t in times]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--runs", type=int, default=5)
    add_write_option(p, "export-cost", "docs/benchmarks.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    job = conformer.tiny() if args.tiny else conformer.base()
    model = job["model"]
    feeds = make_inputs(job["inputs"], dim_sizes(job["inputs"]))
    example = tuple(feeds.values())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        outside, inside = _medians([lambda: _bare(model, example, False, False),
                                    lambda: _bare(model, example, False, True)], args.runs)
        rows.append(("patch overhead", "torchscript", f"{inside / outside:.3f}x", f"{outside:.2f}s -> {inside:.2f}s",
                     "<= 1.05"))
        variants = [("torchscript", True), ("torchscript", False)] + ([("dynamo", True)] if HAS_DYNAMO else [])
        for exporter, cleanup in variants:
            dynamo = exporter == "dynamo"
            reports = []

            def pipeline():
                seconds, report = _pipeline(job, exporter, cleanup, tmp)
                reports.append(report)
                return seconds

            bare_path = os.path.join(tmp, f"bare_{exporter}.onnx")
            bare, full = _medians([lambda: _bare(model, example, dynamo, True, bare_path), pipeline],
                                  max(1, args.runs // (3 if dynamo else 1)))
            parts = ", ".join(f"{k} {v:.2f}s" for k, v in reports[-1].timings.items() if k != "total")
            rows.append(("pipeline cost" + ("" if cleanup else ", cleanup=False"), exporter, f"{full / bare:.2f}x",
                         f"{bare:.2f}s -> {full:.2f}s ({parts})",
                         "<= 1.1" if dynamo else "<= 1.5"))
    size = "tiny (2 x 32)" if args.tiny else "12 x 256, kernel 31"
    lines = [f"Conformer {size}; torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"1 torch thread, median of {args.runs} interleaved runs", "",
             "| ratio | exporter | measured | seconds | target |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "export-cost")
    return rows


if __name__ == "__main__":
    main()
