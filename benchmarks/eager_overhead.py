"""Eager cost of being inside ``patched()`` without exporting (target <= 1.02x).

    .venv/bin/python benchmarks/eager_overhead.py [--tiny] [--write docs/benchmarks.md]

The bundled 12 x 256 Conformer (string-padded depthwise convs, SDPA, the
patched functions on its hot path) runs forward inside and outside the block,
interleaved, in one process; the ratio of medians is printed.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import median_seconds  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.models import conformer  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "fast", "writes": "docs/benchmarks.md"}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    add_write_option(p, "eager-overhead", "docs/benchmarks.md")
    args = p.parse_args(argv)
    job, t, runs = (conformer.tiny(), 40, 5) if args.tiny else (conformer.base(), 400, 50)
    torch.set_num_threads(1)
    model = job["model"]
    features = job["inputs"][0].dims[2]
    x, lengths = torch.randn(4, t, features), torch.tensor([t, t - 3, t - 7, t // 2])
    ctx = onnx_compat.patched()

    def forward():
        with torch.no_grad():
            model(x, lengths)

    outs, ins = [], []
    for _ in range(5):  # interleaved, so drift hits both sides alike
        outs.append(median_seconds(forward, runs // 5))
        with ctx:       # entering the block is not what is measured
            ins.append(median_seconds(forward, runs // 5))
    ratio = sorted(ins)[2] / sorted(outs)[2]
    blocks = len(model.blocks)
    text = (f"torch {torch.__version__}, 1 thread, Conformer {blocks} blocks, B=4, T={t}: forward outside "
            f"patched() {sorted(outs)[2] * 1e3:.2f} ms, inside {sorted(ins)[2] * 1e3:.2f} ms, "
            f"**{ratio:.3f}x** (target <= 1.02x)")
    print(text)
    if args.write:
        write_marked(args.write, text, "eager-overhead")
    return ratio


if __name__ == "__main__":
    main()
