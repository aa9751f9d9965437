"""Streaming latency: one chunk through ONNX Runtime against one chunk through eager PyTorch.

    .venv/bin/python benchmarks/streaming.py [--tiny] [--exporter torchscript|dynamo]

The bundled streaming Conformer (80 features, chunks of 16 frames = 160 ms at
a 10 ms hop, two chunks of left context) and LSTM encoder are exported with
``export_streaming`` (which proves the stream first), then run at B=1, one
thread each, chunk after chunk with the states fed back, interleaved so that
load on the machine hits both sides alike. Printed per model: the median
per-chunk latency of each, their ratio, and the real-time factor (compute time
per second of audio) of the streamed ONNX encoder.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from onnx_compat.models import lstm_encoder, streaming_conformer
from onnx_compat.streaming import export_streaming
from onnx_compat.runtimes.session import open_session

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None}

HOP_SECONDS = 0.01  # one feature frame


def _jobs(tiny: bool):
    if tiny:
        return {"conformer": streaming_conformer.streaming_job(dim=16, chunk=8),
                "lstm": lstm_encoder.streaming_job(chunk=8)}
    return {"conformer": streaming_conformer.streaming_job(features=80, dim=144, layers=6, classes=500, chunk=16,
                                                           left_chunks=2, kernel=15),
            "lstm": lstm_encoder.streaming_job(features=80, hidden=320, layers=3, classes=500, chunk=16)}


def _stream_times(job, path: str, chunks: int, rounds: int):
    """Per-chunk seconds, eager and ONNX Runtime, over ``rounds`` interleaved passes of ``chunks`` chunks."""
    spec = job["inputs"][0]
    chunk = spec.dims[1]
    data = torch.randn(1, chunk * chunks, spec.dims[2])
    sess = open_session(path, threads=1)
    names = [s.name for s in job["states"]]
    outs = [job["outputs"][0].name] + [s.output for s in job["states"]]
    eager, ort_times = [], []

    def eager_pass():
        states = [s.initial({"batch": 1}) for s in job["states"]]
        with torch.no_grad():
            for c in range(chunks):
                t0 = time.perf_counter()
                _, *states = job["step"](data[:, c * chunk:(c + 1) * chunk], *states)
                eager.append(time.perf_counter() - t0)

    def ort_pass():
        states = [s.initial({"batch": 1}).numpy() for s in job["states"]]
        x = data.numpy()
        for c in range(chunks):
            feeds = {spec.name: np.ascontiguousarray(x[:, c * chunk:(c + 1) * chunk]), **dict(zip(names, states))}
            t0 = time.perf_counter()
            states = sess.run(outs, feeds)[1:]
            ort_times.append(time.perf_counter() - t0)

    eager_pass(), ort_pass()  # warm-up
    eager.clear(), ort_times.clear()
    for _ in range(rounds):
        eager_pass()
        ort_pass()
    return statistics.median(eager), statistics.median(ort_times), chunk


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo", "auto"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    chunks, rounds = (6, 2) if args.tiny else (30, 5)
    print(f"torch {torch.__version__}, 1 thread, B=1, {chunks} chunks x {rounds} rounds, exporter {args.exporter}")
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, job in _jobs(args.tiny).items():
            path = os.path.join(folder, f"{name}.onnx")
            report = export_streaming(job["step"], path, job["inputs"], job["states"], job["outputs"],
                                      full_forward=job["full_forward"], exporter=args.exporter)
            eager, ort_s, chunk = _stream_times(job, path, chunks, rounds)
            audio = chunk * HOP_SECONDS
            rows[name] = {"eager_ms": eager * 1e3, "ort_ms": ort_s * 1e3, "speedup": eager / ort_s,
                          "rtf": ort_s / audio, "drift": max(e["drift"]["output"] for e in report.verification)}
            r = rows[name]
            print(f"{name:10s} chunk {chunk} frames ({audio * 1e3:.0f} ms): eager {r['eager_ms']:.3f} ms, "
                  f"ORT {r['ort_ms']:.3f} ms per chunk, eager/ORT {r['speedup']:.2f}x, ORT real-time factor "
                  f"{r['rtf']:.4f}, stream drift from full forward {r['drift']:.1e}")
    return rows


if __name__ == "__main__":
    main()
