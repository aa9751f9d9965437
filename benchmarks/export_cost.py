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
- the translation table kept: the bare dynamo export of the tiny Conformer inside ``patched()`` with
  ``translation_table`` against without it (an export after the first in a process; the first builds the table
  either way), at least 5 runs: on the 12 x 256 Conformer its 0.6 s is within the run-to-run noise of a 30 s
  export (one run each gave 1.08x).
- the same pipeline cost on an encoder of ``nn.MultiheadAttention`` blocks
  (``mha_encoder.py``, #29), whose attention is torch's own (TorchScript).
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
import mha_encoder  # noqa: E402
from onnx_compat.spec import dim_sizes, make_inputs  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "fast", "writes": "docs/benchmarks.md"}

NAMES = ["data", "data:size1"]
# --cpu-time: the process's CPU seconds instead of wall seconds, for a machine loaded several times over
# (wall time there is mostly other processes' turns); it counts the pipeline's second thread too
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCK["wall"]
DYNAMIC = {"data": {0: "batch", 1: "time"}, "data:size1": {0: "batch"}}


def _bare(model, args, dynamo, patched, path=None, patches=None):
    """Seconds of a bare ``torch.onnx.export``; with ``path``, to a file as a user's own call writes it."""
    t0 = _clock()
    with onnx_compat.patched(**(patches or {})) if patched else contextlib.nullcontext():
        proto, _ = torch_export(model, args, NAMES, DYNAMIC, dynamo=dynamo)
    if path is not None:
        onnx.save(proto, path)
    return _clock() - t0


def _pipeline(job, exporter, cleanup, tmp, patches=None):
    t0 = _clock()
    report = onnx_compat.export(job["model"], os.path.join(tmp, f"{exporter}.onnx"), job["inputs"], job["outputs"],
                                exporter=exporter, cleanup=cleanup, patches=patches)
    return _clock() - t0, report


WARM_UP = [True]  # --no-warm-up (the tests' smoke run): the script's path without its timing precision


def _medians(fns, runs):
    """Interleaved runs of each fn (after one warm-up each); median seconds per fn."""
    for fn in fns if WARM_UP[0] else ():
        fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for k, fn in enumerate(fns):
            times[k].append(fn())
    return [statistics.median(t) for t in times]


def _pipeline_rows(label, job, example, variants, runs, tmp):
    """Pipeline cost rows of one model (``label`` follows "pipeline cost"): ``onnx_compat.export`` against the bare (patched) export to a file."""
    rows = []
    for exporter, cleanup, *options in variants:
        dynamo, patches = exporter == "dynamo", (options[0] if options else None)
        reports = []

        def pipeline():
            seconds, report = _pipeline(job, exporter, cleanup, tmp, patches)
            reports.append(report)
            return seconds

        bare_path = os.path.join(tmp, f"bare_{exporter}.onnx")
        bare, full = _medians([lambda: _bare(job["model"], example, dynamo, True, bare_path, patches), pipeline],
                              max(1, runs // (3 if dynamo else 1)))
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in reports[-1].timings.items() if k != "total")
        nodes = f"; {reports[-1].nodes_before_cleanup} -> {reports[-1].nodes} nodes" \
            if reports[-1].nodes_before_cleanup else f"; {reports[-1].nodes} nodes"
        without = f", without {', '.join(patches['exclude'])}" if patches else ""
        rows.append(("pipeline cost" + label + ("" if cleanup else ", cleanup=False") + without, exporter,
                     f"{full / bare:.2f}x", f"{bare:.2f}s -> {full:.2f}s ({parts}{nodes})",
                     "<= 1.1" if dynamo else "<= 1.5"))
    return rows


def _table_kept_row(model, example, runs):
    """The bare dynamo export inside ``patched()`` with its table of translations kept between exports
    (``translation_table``: every export after the first in a process) against it built anew each time."""
    kept, anew = _medians([lambda: _bare(model, example, True, True),
                           lambda: _bare(model, example, True, True, patches={"exclude": ["translation_table"]})], runs)
    return ("translation table kept (2nd export on), tiny Conformer", "dynamo", f"{kept / anew:.2f}x",
            f"{anew:.2f}s -> {kept:.2f}s", "< 1")


def _example(job):
    return tuple(make_inputs(job["inputs"], dim_sizes(job["inputs"])).values())


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", choices=["conformer", "mha"], help="one model only")
    p.add_argument("--clock", choices=sorted(CLOCK), default="wall", help="cpu: process CPU seconds (loaded machine)")
    p.add_argument("--no-warm-up", action="store_true", help="no warm-up run before the timed ones (a smoke run)")
    p.add_argument("--no-dynamo", action="store_true", help="TorchScript rows only (a smoke run)")
    add_write_option(p, "export-cost", "docs/benchmarks.md")
    args = p.parse_args(argv)
    WARM_UP[0] = not args.no_warm_up
    global _clock
    _clock = CLOCK[args.clock]
    torch.set_num_threads(1)
    job = conformer.tiny() if args.tiny else conformer.base()
    mha = mha_encoder.job(blocks=2, dim=32) if args.tiny else mha_encoder.job()
    example = _example(job)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "mha":
            outside, inside = _medians([lambda: _bare(job["model"], example, False, False),
                                        lambda: _bare(job["model"], example, False, True)], args.runs)
            rows.append(("patch overhead", "torchscript", f"{inside / outside:.3f}x",
                         f"{outside:.2f}s -> {inside:.2f}s", "<= 1.05"))
            variants = [("torchscript", True), ("torchscript", False)] + (
                [("dynamo", True)] if HAS_DYNAMO and not args.no_dynamo else [])
            rows += _pipeline_rows("", job, example, variants, args.runs, tmp)
            if HAS_DYNAMO and not args.no_dynamo:  # on the tiny Conformer: on the 12 x 256 one 0.6 s is within the noise
                small = conformer.tiny()
                rows.append(_table_kept_row(small["model"], _example(small), max(args.runs, 5)))
        if args.only != "conformer":
            # without mha_compact: the export the issue measured (2,806 nodes), both sides without it
            rows += _pipeline_rows(", MHA encoder", mha, _example(mha), [
                ("torchscript", True), ("torchscript", True, {"exclude": ["mha_compact"]})], args.runs, tmp)
    size = "tiny (2 x 32)" if args.tiny else "12 x 256, kernel 31"
    lines = [f"Conformer {size}; MHA encoder ({'2 x 32' if args.tiny else '12 x 256'}, nn.MultiheadAttention "
             f"with key padding mask, benchmarks/mha_encoder.py); torch {torch.__version__}, {platform.machine()}, "
             f"{os.cpu_count()} CPUs, 1 torch thread, {args.clock} clock, median of {args.runs} interleaved runs, load average "
             f"{_load()}", "",
             "| ratio | exporter | measured | seconds | target |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "export-cost")
    return rows


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    main()
