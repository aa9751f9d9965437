"""What each padding path costs: ORT latency (ratio to dynamo native), nodes, export time.

    .venv/bin/python benchmarks/padding_paths.py [--tiny] [--runs N] [--write docs/benchmarks.md]

Paths per conv stack: dynamo native; TorchScript native (auto_pad; ONNX Runtime
refuses it with dilation); TorchScript under ``patched()`` (the symmetric path
when dilation*(k-1) is even, else the asymmetric F.pad path); the same plus
the pipeline's cleanup (ONNX Runtime's basic offline optimiser). All measured
side by side in one run.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import ort_latency, torch_export  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.cleanup import cleanup  # noqa: E402
from onnx_compat.patches._padding import is_symmetric, same_pads  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "fast", "writes": "docs/benchmarks.md"}


def stack(rank, channels, kernel, dilation, depthwise, layers):
    conv = (nn.Conv1d, nn.Conv2d)[rank - 1]
    mods = []
    for _ in range(layers):
        mods += [conv(channels, channels, kernel, padding="same", dilation=dilation,
                      groups=channels if depthwise else 1), nn.ReLU()]
    return nn.Sequential(*mods).eval()


def configs(tiny):
    c, t, layers = (8, 40, 2) if tiny else (256, 500, 4)
    side = 12 if tiny else 48
    return [
        ("depthwise k=31", dict(rank=1, channels=c, kernel=31, dilation=1, depthwise=True, layers=layers), (1, c, t)),
        ("even k=32", dict(rank=1, channels=c, kernel=32, dilation=1, depthwise=True, layers=layers), (1, c, t)),
        ("dilated k=3 d=2", dict(rank=1, channels=c, kernel=3, dilation=2, depthwise=False, layers=layers), (1, c, t)),
        ("2-D k=5", dict(rank=2, channels=c // 4 or 2, kernel=5, dilation=1, depthwise=False, layers=layers),
         (1, c // 4 or 2, side, side)),
    ]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="smoke-test size")
    p.add_argument("--runs", type=int, default=None)
    add_write_option(p, "padding-paths", "docs/benchmarks.md")
    args = p.parse_args(argv)
    runs = args.runs or (3 if args.tiny else 50)
    torch.set_num_threads(1)
    rows = []
    for name, cfg, shape in configs(args.tiny):
        torch.manual_seed(0)
        model = stack(**cfg)
        x = torch.randn(*shape)
        dyn = {"x": {0: "batch", **{2 + i: f"s{i}" for i in range(cfg["rank"])}}}
        pads = same_pads(cfg["kernel"], cfg["dilation"], cfg["rank"])
        path = "symmetric" if is_symmetric(pads) else "asymmetric"
        feeds = {"x": x.numpy()}
        results = {}
        proto, secs = torch_export(model, (x,), ["x"], dyn, dynamo=True)
        results["dynamo native"] = (proto, secs)
        results["torchscript native"] = torch_export(model, (x,), ["x"], dyn, dynamo=False)
        with onnx_compat.patched():
            proto, secs = torch_export(model, (x,), ["x"], dyn, dynamo=False)
        results[f"torchscript + patch ({path})"] = (proto, secs)
        results[f"torchscript + patch ({path}) + cleanup"] = (cleanup(proto), secs)
        base = ort_latency(results["dynamo native"][0], feeds, runs)
        for label, (proto, secs) in results.items():
            try:
                latency = f"{ort_latency(proto, feeds, runs) / base:.2f}x"
            except Exception as exc:
                latency = "ORT fails (" + str(exc).split(":")[-1].strip()[:40] + ")"
            rows.append((name, label, latency, len(proto.graph.node), f"{secs:.2f}s"))
    lines = [f"torch {torch.__version__}, 1 ONNX Runtime thread, median of {runs} runs, "
             f"input {'tiny' if args.tiny else 'B=1, C=256, T=500 (2-D: 64x48x48)'}", "",
             "| stack | path | ORT latency vs dynamo native | nodes | export time |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "padding-paths")
    return rows


if __name__ == "__main__":
    main()
