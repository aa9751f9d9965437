"""OpenVINO (CPU, f32) against ONNX Runtime, and what the OpenVINO graph fixes cost ONNX Runtime.

Side by side in one run, one thread each, median of repeated calls, as ratios:
for the bundled Conformer (base, 12 x 256) and BLSTM exported with TorchScript,
(1) ONNX Runtime on the graph after ``fix_for_openvino`` / before it (the LSTM
rewrite runs each direction without ``sequence_lens``), and (2) OpenVINO /
ONNX Runtime on the fixed graph. ``python benchmarks/openvino_latency.py``.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import onnx

from onnx_compat import export
from onnx_compat.models import blstm, conformer
from onnx_compat.pipeline.openvino_fixes import fix_for_openvino
from onnx_compat.runtimes.openvino import openvino_runtime
from onnx_compat.runtimes.session import open_session

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_seconds  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None}

RUNS = 20


def _ort(path):
    return open_session(path, threads=1)


def measure(name, job, batch, steps, folder):
    raw = os.path.join(folder, f"{name}.onnx")
    export(job["model"], raw, job["inputs"], job["outputs"], exporter="torchscript", verify=False)
    proto = onnx.load(raw)
    changes, _ = fix_for_openvino(proto)
    fixed = raw.replace(".onnx", "_ov.onnx")
    onnx.save(proto, fixed)
    features = job["inputs"][0].dims[2]
    rng = np.random.default_rng(0)
    feeds = {"data": rng.standard_normal((batch, steps, features)).astype(np.float32),
             "data:size1": np.linspace(steps, steps // 2, batch).astype(np.int32)}
    before, after = _ort(raw), _ort(fixed)
    t_before = median_seconds(lambda: before.run(None, feeds), RUNS)
    t_after = median_seconds(lambda: after.run(None, feeds), RUNS)
    openvino = openvino_runtime()
    t_ov = median_seconds(lambda: openvino.run(fixed, feeds), RUNS)
    print(f"{name:10s} B={batch} T={steps}: {len(changes)} rewrites; ONNX Runtime fixed/raw {t_after / t_before:.2f} "
          f"({t_after * 1e3:.1f} / {t_before * 1e3:.1f} ms); OpenVINO f32 / ONNX Runtime {t_ov / t_after:.2f} "
          f"({t_ov * 1e3:.1f} ms)")


def main():
    with tempfile.TemporaryDirectory() as folder:
        measure("conformer", conformer.base(), 1, 500, folder)
        measure("blstm", blstm.build(features=40, hidden=256, layers=3, classes=500), 4, 300, folder)


if __name__ == "__main__":
    main()
