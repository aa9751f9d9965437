"""Each rewrite on its own in ONNX Runtime: the patched graph with each exporter against the unpatched one.

The cases are ``benchmarks/op_tail.py``'s (the table of ``onnx_compat/models/op_tail_cases.py``
and an LSTMP), exported at the tests' example sizes and timed at a larger one.
The patched graph is cleaned as the pipeline writes it after TorchScript (and
after dynamo when it holds LSTM/GRU); every graph is checked against eager at
the tests' shapes before it is timed, an unpatched one that is wrong is shown
as such and not timed. The spectral rewrites (STFT as a strided conv, FFTs as
table matmuls) against ONNX's own ``STFT``/``DFT`` are ``benchmarks/spectral.py``'s table.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_tail  # noqa: E402
from latency_timing import clock_for, eager_call, interleaved_medians, ort_call  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.capture import HAS_DYNAMO  # noqa: E402
from onnx_compat.models import op_tail_cases, recurrent_cases  # noqa: E402
from onnx_compat.pipeline.cleanup import cleanup  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None}

EXPORTERS = ["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"]
QUICK = ["adaptive_avg_pool1d"]
# the rewrite each case exercises, and the op of ours that does the work
REWRITE = {
    "adaptive_avg_pool1d": "adaptive pooling as masked MatMul",
    "adaptive_max_pool1d": "adaptive pooling as masked ReduceMax",
    "adaptive_avg_pool2d": "adaptive pooling as masked MatMul",
    "adaptive_max_pool2d": "adaptive pooling as masked ReduceMax",
    "antialias_scale": "antialiased resize as two MatMuls",
    "antialias_bicubic_size": "antialiased resize as two MatMuls",
    "lstm_proj_size": "LSTMP as Loop/Scan",
}


def _timing_args(name: str):
    """The case's own inputs (its ``PatchCase``), at a size worth timing."""
    if name == "lstm_proj_size":
        return recurrent_cases.inputs(4, 400, 0)
    case = next(c for c in op_tail_cases.CASES if c.name == name)
    if name == "length_regulator":
        return case.inputs(2, 400, 0)
    return case.inputs(4, 160 if 2 in case.dynamic.get(0, {}) else 400, 0)  # images: height and width


def patched_graph(build, export, check, exporter, model=None):
    """One case's patched graph, cleaned as the pipeline cleans it, checked against the eager model."""
    model = build() if model is None else model
    with onnx_compat.patched():
        patched = export(model, exporter)
    if exporter == "torchscript" or any(n.op_type in ("LSTM", "GRU") for n in patched.graph.node):
        patched = cleanup(patched)
    check(patched, model)
    return patched


def _graphs(build, export, check, exporter) -> Dict[str, object]:
    """Patched (cleaned) and unpatched graphs of one case with one exporter; a string says why one is absent."""
    model = build()
    out: Dict[str, object] = {f"ours {exporter}": patched_graph(build, export, check, exporter, model)}
    try:
        plain = export(build(), exporter)
    except Exception:  # noqa: BLE001 - the outcome is the cell
        out[f"vanilla {exporter}"] = "export fails"
        return out
    try:
        check(plain, model)
    except AssertionError:
        out[f"vanilla {exporter}"] = f"wrong numbers ({len(plain.graph.node)})"
    except Exception:  # noqa: BLE001
        out[f"vanilla {exporter}"] = f"fails in ORT ({len(plain.graph.node)})"
    else:
        out[f"vanilla {exporter}"] = plain
    return out


def measure(names: Optional[List[str]], rounds: int, exporters=EXPORTERS) -> List[dict]:
    results = []
    for name, (build, export, check) in op_tail.cases().items():
        if names and name not in names:
            continue
        graphs: Dict[str, object] = {}
        for exporter in exporters:
            graphs.update(_graphs(build, export, check, exporter))
        args = _timing_args(name)
        feeds = {f"x{i}": a.numpy() for i, a in enumerate(args)}
        fns = {k: ort_call(g, feeds, 1) for k, g in graphs.items() if not isinstance(g, str)}
        fns["eager"] = eager_call(build(), args)
        seconds = interleaved_medians(fns, rounds, clock=clock_for(1))
        results.append({"name": name, "graphs": graphs, "seconds": seconds})
        print(table(results[-1:])[-1], file=sys.stderr, flush=True)
    return results


COLUMNS = ["ours torchscript", "ours dynamo", "vanilla torchscript", "vanilla dynamo", "eager"]


def _cell(result: dict, col: str, base: float) -> str:
    g, s = result["graphs"].get(col), result["seconds"].get(col)
    if s is not None:
        return f"{s / base:.2f}x" + (f" ({len(g.graph.node)})" if g is not None else "")
    return g if isinstance(g, str) else "-"


def table(results: List[dict]) -> List[str]:
    lines = ["| rewrite case | ours TorchScript, time | " + " | ".join(COLUMNS) + " |",
             "|---" * (2 + len(COLUMNS)) + "|"]
    for r in results:
        base = r["seconds"].get("ours torchscript") or r["seconds"]["ours dynamo"]
        lines.append(f"| {r['name']} | {base * 1e3:.3f} ms | " + " | ".join(_cell(r, c, base) for c in COLUMNS) + " |")
    return lines


def slower(results: List[dict], margin: float = 1.10) -> List[str]:
    """Our graph where an alternative that is right runs faster by more than ``margin``, with the op
    that takes our graph's time (the most frequent heavy op of the patched graph)."""
    found = []
    for r in results:
        s = r["seconds"]
        for ours in [k for k in s if k.startswith("ours")]:
            alternatives = {k: v for k, v in s.items() if k not in ("eager", ours)}
            best = min(alternatives, key=alternatives.get) if alternatives else None
            if best and s[ours] > margin * s[best]:
                found.append(f"- {r['name']}: {ours} takes {s[ours] / s[best]:.2f}x {best} "
                             f"({REWRITE.get(r['name'], 'patch')}; ops {heavy_ops(r['graphs'][ours])})")
    return found or ["- none beyond the noise margin (1.10x)"]


HEAVY = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Loop", "Scan", "LSTM", "ReduceMax", "ReduceMean",
         "ReduceSum", "Resize", "Einsum", "Where", "Gather", "ScatterND", "CumSum")


def heavy_ops(proto) -> str:
    counts: Dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type in HEAVY:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


if __name__ == "__main__":
    torch.set_num_threads(1)
    rs = measure(sys.argv[1:] or None, 7)
    print("\n".join(table(rs) + [""] + slower(rs)))
