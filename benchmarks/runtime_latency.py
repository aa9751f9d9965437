"""The exported model's latency in ONNX Runtime: our export with each exporter, the vanilla ones, eager.

    .venv/bin/python benchmarks/runtime_latency.py [--quick] [--only NAME ...] [--rounds N]
        [--scale K] [--write docs/benchmarks.md]

For each model of the zoo (the bundled ones and the third-party ones,
``onnx_compat/models/zoo.py``): the file ``onnx_compat.export`` writes with
each exporter, the unpatched export of each exporter where it verifies, and
the eager model, all timed in the same interleaved rounds (``latency_timing``)
at batch 4 and ``--scale`` times the example's other dims, with one thread
(ONNX Runtime ``intra_op_num_threads=1``, ``torch.set_num_threads(1)``) and
with each library's default (one per core). Figures are ratios to our
TorchScript export in the same rounds; the machine's load is printed with
them. A second table does the same for the rewrites one by one (the op-tail
cases of ``onnx_compat/models/op_tail_cases.py`` and an LSTMP): the patched graph with each
exporter (cleaned, as the pipeline writes it) against the unpatched one where
that one is right. ``--quick``: one small model, one rewrite, 3 rounds.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_timing import clock_for, eager_call, interleaved_medians, ort_call  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.models.zoo import ZOO  # noqa: E402
from onnx_compat.pipeline.adapter import IOAdapter  # noqa: E402
from onnx_compat.pipeline.capture import HAS_DYNAMO, error_line  # noqa: E402
from onnx_compat.pipeline.vanilla import export_proto  # noqa: E402
from onnx_compat.spec import dim_sizes, forward_arguments, make_inputs  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/benchmarks.md"}

EXPORTERS = ["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"]
QUICK = ["onnx_compat conv demo"]
THREADS = {"1": 1, "default": 0}


@dataclass
class Contender:
    """One graph (or the eager model) of one model: how to call it, or why it is absent."""

    name: str
    proto: Optional[onnx.ModelProto] = None
    failure: Optional[str] = None
    nodes: Optional[int] = None
    extra: Dict[str, str] = field(default_factory=dict)


def _short(exc: BaseException, limit: int = 60) -> str:
    return error_line(exc).replace("|", "/")[:limit]


def ours(job: dict, exporter: str, folder: str) -> Contender:
    """The verified file ``onnx_compat.export`` writes."""
    path = os.path.join(folder, f"ours_{exporter}.onnx")
    try:
        onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter=exporter)
    except Exception as exc:  # noqa: BLE001 - the failure is the cell
        return Contender(f"ours {exporter}", failure="fails: " + _short(exc))
    proto = onnx.load(path)
    return Contender(f"ours {exporter}", proto, nodes=len(proto.graph.node))


def vanilla(job: dict, exporter: str) -> Contender:
    """The unpatched export, kept only where it verifies at new shapes (a wrong graph's speed means nothing)."""
    name = f"vanilla {exporter}"
    try:
        proto = export_proto(job["model"], job["inputs"], job["outputs"], exporter)
    except Exception as exc:  # noqa: BLE001
        return Contender(name, failure="export fails")
    try:
        onnx_compat.verify(proto, job["model"], job["inputs"], job["outputs"])
    except Exception as exc:  # noqa: BLE001
        stage = "wrong numbers" if "differ" in str(exc) or "tolerance" in str(exc) else "fails in ORT"
        return Contender(name, failure=stage, nodes=len(proto.graph.node))
    return Contender(name, proto, nodes=len(proto.graph.node))


def timing_sizes(inputs, scale: int) -> Dict[str, int]:
    """Batch 4, every other dynamic dim ``scale`` times its example size (within its bounds)."""
    example = dim_sizes(inputs)
    overrides = {}
    for spec in inputs:
        for axis, dim in spec.dynamic_axes().items():
            overrides.setdefault(dim.name, 4 if axis == 0 else example[dim.name] * scale)
    return dim_sizes(inputs, overrides)


def time_all(contenders: List[Contender], calls: Dict[str, Callable], rounds: int) -> Dict[str, Dict[str, float]]:
    """Median seconds per contender at each thread setting, all in the same rounds."""
    out: Dict[str, Dict[str, float]] = {}
    for label, threads in THREADS.items():
        torch.set_num_threads(threads or os.cpu_count())
        fns = {c.name: ort_call(c.proto, calls["feeds"], threads) for c in contenders if c.proto is not None}
        fns["eager"] = calls["eager"]
        out[label] = interleaved_medians(fns, rounds, clock=clock_for(threads))
    torch.set_num_threads(1)
    return out


def measure_model(name: str, factory, scale: int, rounds: int, exporters=EXPORTERS) -> dict:
    job = factory()
    with tempfile.TemporaryDirectory() as folder:
        contenders = [ours(job, e, folder) for e in exporters] + [vanilla(job, e) for e in exporters]
    feeds = make_inputs(job["inputs"], timing_sizes(job["inputs"], scale), seed=7)
    forward = IOAdapter(job["model"], forward_arguments(job["model"], job["inputs"]), job["outputs"])
    calls = {"feeds": {k: v.numpy() for k, v in feeds.items()}, "eager": eager_call(forward, list(feeds.values()))}
    return {"name": name, "contenders": contenders, "seconds": time_all(contenders, calls, rounds)}


COLUMNS = ["ours torchscript", "ours dynamo", "vanilla torchscript", "vanilla dynamo", "eager"]


def model_rows(result: dict) -> List[str]:
    """One row per thread setting: each contender's time as a ratio to our TorchScript export."""
    by = {c.name: c for c in result["contenders"]}
    rows = []
    for label, seconds in result["seconds"].items():
        base = seconds.get("ours torchscript") or seconds.get("ours dynamo")
        cells = []
        for col in COLUMNS:
            c = by.get(col)
            if col in seconds:
                cells.append(f"{seconds[col] / base:.2f}x" + (f" ({c.nodes})" if c and c.nodes else ""))
            elif c is not None and c.failure:
                cells.append(c.failure + (f" ({c.nodes})" if c.nodes else ""))
            else:
                cells.append("-")
        rows.append(f"| {result['name']} | {label} | {base * 1e3:.2f} ms | " + " | ".join(cells) + " |")
    return rows


def model_table(results: List[dict]) -> List[str]:
    head = ["| model | threads | ours TorchScript, time | " + " | ".join(COLUMNS) + " |", "|---" * (3 + len(COLUMNS)) + "|"]
    return head + [row for r in results for row in model_rows(r)]


def load_line() -> str:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return (f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}, {platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average {load} during the run")


def _head(rounds: int, scale: int) -> List[str]:
    return [load_line() + f"; median of {rounds} interleaved rounds; batch 4, {scale}x the example's other dims; "
            "1 thread: CPU time of the calling thread, default threads: wall time", ""]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one small model and one rewrite, 3 rounds")
    p.add_argument("--only", nargs="*", help="zoo names (models) and op-tail case names (rewrites)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--scale", type=int, default=4, help="timing size: this times the example's non-batch dims")
    p.add_argument("--no-rewrites", action="store_true")
    p.add_argument("--exporters", nargs="*", choices=EXPORTERS, help="only these exporters (default: both)")
    add_write_option(p, "runtime-latency", "docs/benchmarks.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    exporters = args.exporters or EXPORTERS
    rounds = 3 if args.quick else args.rounds
    names = args.only or (QUICK if args.quick else list(ZOO))
    results = []
    for n in [n for n in names if n in ZOO]:
        results.append(measure_model(n, ZOO[n], args.scale, rounds, exporters))
        print("\n".join(model_rows(results[-1])), file=sys.stderr, flush=True)  # progress: a long run on a busy machine
        if args.write:  # a run stopped half-way still leaves the models it measured
            write_marked(args.write, "\n".join(_head(rounds, args.scale) + model_table(results)), "runtime-latency")
    lines = _head(rounds, args.scale) + model_table(results)
    rewrites = []
    if not args.no_rewrites:
        import rewrite_latency
        wanted = [n for n in (args.only or []) if n not in ZOO] or (rewrite_latency.QUICK if args.quick else None)
        rewrites = rewrite_latency.measure(wanted, rounds, exporters)
        lines += ["", *rewrite_latency.table(rewrites), "", *rewrite_latency.slower(rewrites)]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "runtime-latency")
    return results, rewrites


if __name__ == "__main__":
    main()
