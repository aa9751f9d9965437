"""Time and peak memory to a verified model as the weights grow, up to past protobuf's 2 GB.

    .venv/bin/python benchmarks/model_size.py [--sizes 10M,100M,600M] [--exporters torchscript,dynamo]
                                              [--write docs/benchmarks.md]

A synthetic sequence model (``[B, T, F]`` in, Conv1d(padding="same") then a
stack of Linear + ReLU) of about 10 M, 100 M and 600 M parameters (600 M is
2.4 GB of float32 weights: past 2 GB, so it is written as ``model.onnx`` plus
``model.onnx.data``). Each row runs in a fresh process, in a temporary folder,
so its peak resident memory is its own. Each child first exports a tiny model the same way: the first
export in a process loads the exporters' own modules once (measured and shown apart), which the rows
would otherwise count as if it grew with the weights:

- bare: ``torch.onnx.export`` to a file as a user's own call does (dynamo:
  the program saved with its weights beside it);
- pipeline: ``onnx_compat.export`` (export, repair, cleanup, verification at
  three new shapes, metadata, atomic write), then the written file loaded
  by ONNX Runtime from its path;
- the export's own peak: how far resident memory rose above where it was when the export began (the
  model built, torch imported), relative to the weights' size; for the pipeline it is the report's
  ``peak_memory`` (``onnx_compat/pipeline/memory.py``), for the bare export the same measurement around it;
- peak RSS of each process (torch's ~0.4 GiB and the model included) relative to the weights' size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/benchmarks.md"}

SIZES = {"tiny": (64, 2), "10M": (1024, 9), "100M": (2048, 23), "600M": (4096, 35)}  # (width, Linear layers) after a Conv1d(k=3)


def build(size: str):
    import torch

    width, depth = SIZES[size]

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(80, width, 3, padding="same")
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
            self.out = torch.nn.Linear(width, 80)

        def forward(self, data):
            x = self.conv(data.transpose(1, 2)).transpose(1, 2)
            for layer in self.layers:
                x = torch.relu(layer(x)) + x
            return self.out(x)

    torch.manual_seed(0)
    with torch.no_grad():
        model = Stack().eval()
        for p in model.parameters():  # keep activations of order 1 through the residual stack
            p.mul_(0.5)
    return model


def _one(size: str, exporter: str, mode: str) -> dict:
    """One measurement in this process (run as a child)."""
    import onnxruntime as ort
    import torch

    from onnx_compat import Dim, TensorSpec

    from onnx_compat import export
    from onnx_compat.pipeline import memory
    from onnx_compat.pipeline.vanilla import plain_export
    from onnx_compat.pipeline.weights import weight_bytes

    def run(model, path):
        """One export as the row's mode does it; the export's own peak (``memory.py``)."""
        if mode == "bare":
            with memory.PeakMemory() as measured:
                plain_export(model, (torch.randn(2, 50, 80),), exporter, ["data"], {"data": {0: "batch", 1: "time"}},
                             ["out"], max_size=None, path=path)
            return None, measured.result().to_dict(weight_bytes(model))
        report = export(model, path, [TensorSpec("data", [Dim("batch"), Dim("time"), 80])],
                        [TensorSpec("out", [Dim("batch"), Dim("time"), 80])], exporter=exporter)
        return report, report.peak_memory

    with tempfile.TemporaryDirectory(dir=os.environ.get("ONNX_COMPAT_BENCH_DIR")) as tmp:
        first = run(build("tiny"), os.path.join(tmp, "first.onnx"))[1]
    model = build(size)
    weights = weight_bytes(model)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory(dir=os.environ.get("ONNX_COMPAT_BENCH_DIR")) as tmp:
        path = os.path.join(tmp, "model.onnx")
        t0 = time.perf_counter()
        report, own = run(model, path)
        seconds = time.perf_counter() - t0
        files = sorted(os.listdir(tmp))
        on_disk = sum(os.path.getsize(os.path.join(tmp, f)) for f in files)
        if mode != "bare":
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            sess.run(None, {"data": torch.randn(1, 17, 80).numpy()})
    return {"size": size, "exporter": exporter, "mode": mode, "params": params, "weights": weights,
            "seconds": seconds, "peak_rss": memory.process_peak(), "peak_export": own["bytes"],
            "peak_method": own["method"], "peak_stage": _top_stage(own), "first_export": first["bytes"],
            "files": files, "bytes_on_disk": on_disk,
            "max_abs_err": report.max_abs_err if report else None,
            "external_data": report.external_data if report else None,
            "timings": report.timings if report else None}


def _top_stage(peak: dict):
    stages = peak.get("stages") or {}
    return max(stages, key=stages.get) if stages else None


def measure(size: str, exporter: str, mode: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the child measures this checkout's onnx_compat
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, __file__, "--child", size, exporter, mode], capture_output=True,
                         text=True, check=False, env=env)
    if out.returncode != 0:
        return {"size": size, "exporter": exporter, "mode": mode, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows) -> str:
    by = {(r["size"], r["exporter"], r["mode"]): r for r in rows}
    lines = ["| model | weights | exporter | bare export | pipeline (verified) | ratio | export's own peak: bare | "
             "pipeline | process peak RSS: bare | pipeline | files written |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (size, exporter, mode), row in by.items():
        if mode != "pipeline":
            continue
        bare = by.get((size, exporter, "bare"), {})
        if "error" in row:
            lines.append(f"| {size} | | {exporter} | | failed: {row['error'][:80]} | | | | | | |")
            continue
        gb = row["weights"] / 2**30

        def peak(r, key):
            return f"{r[key] / 2**30:.2f} GiB ({r[key] / r['weights']:.1f}x)" if key in r else "-"
        ratio = f"{row['seconds'] / bare['seconds']:.2f}x" if "seconds" in bare else "-"
        lines.append(f"| {row['params'] / 1e6:.0f} M params | {gb:.2f} GiB | {exporter} | "
                     f"{bare.get('seconds', float('nan')):.1f} s | {row['seconds']:.1f} s | {ratio} | "
                     f"{peak(bare, 'peak_export')} | {peak(row, 'peak_export')} | {peak(bare, 'peak_rss')} | "
                     f"{peak(row, 'peak_rss')} | {' + '.join(row['files'])} |")
    return "\n".join(lines + [""] + _first_exports(rows))


def _first_exports(rows) -> list:
    """The warm-up's own peak: what a process's first export costs once, whatever the model's size."""
    lines = ["| first export in a process (tiny model) | bare | pipeline |", "|---|---|---|"]
    for exporter in dict.fromkeys(r["exporter"] for r in rows):
        cells = []
        for mode in ("bare", "pipeline"):
            seen = [r["first_export"] / 2**30 for r in rows
                    if r["exporter"] == exporter and r["mode"] == mode and "first_export" in r]
            span = {f"{v:.2f}" for v in (min(seen), max(seen))} if seen else set()
            cells.append("–".join(sorted(span)) + " GiB" if span else "-")
        lines.append(f"| {exporter} | {cells[0]} | {cells[1]} |")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_one(*sys.argv[2:5])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10M,100M,600M")
    ap.add_argument("--exporters", default="torchscript,dynamo")
    add_write_option(ap, "model-size", "docs/benchmarks.md")
    ap.add_argument("--json", help="also save the raw rows here")
    args = ap.parse_args()
    rows = []
    for size in args.sizes.split(","):
        for exporter in args.exporters.split(","):
            for mode in ("bare", "pipeline"):
                rows.append(measure(size, exporter, mode))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.write:
        write_marked(args.write, text, "model-size")


if __name__ == "__main__":
    main()
