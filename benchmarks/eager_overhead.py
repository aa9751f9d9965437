"""Eager cost of being inside ``patched()`` without exporting (target <= 1.02x).

    .venv/bin/python benchmarks/eager_overhead.py [--tiny]

A conv-heavy sequence model (12 string-padded Conv1d layers of width 256, the
conv share of a 12x256 Conformer) runs forward inside and outside the block,
interleaved, in one process; the ratio of medians is printed.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import median_seconds  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.models.conv_demo import ConvDemo  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    layers, width, t, runs = (2, 8, 20, 5) if args.tiny else (12, 256, 200, 100)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ConvDemo(features=80, hidden=width, classes=64, kernels=(31,) * layers, dilations=(1,) * layers).eval()
    x, lengths = torch.randn(4, t, 80), torch.tensor([t, t - 3, t - 7, t // 2])
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
    print(f"torch {torch.__version__}, 1 thread, {layers} x Conv1d({width}, k=31, same), B=4, T={t}")
    print(f"forward outside patched(): {sorted(outs)[2] * 1e3:.2f} ms, inside: {sorted(ins)[2] * 1e3:.2f} ms, "
          f"ratio {ratio:.3f}x (target <= 1.02x)")
    return ratio


if __name__ == "__main__":
    main()
