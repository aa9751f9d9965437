"""Shared timing helpers for the benchmarks: one ORT thread, median of many runs."""
from __future__ import annotations

import statistics
import time

import numpy as np
import onnx

from onnx_compat.pipeline.vanilla import plain_export
from onnx_compat.runtimes.session import open_session


def median_seconds(fn, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ort_latency(proto: onnx.ModelProto, feeds: dict, runs: int) -> float:
    """Median seconds per run in ONNX Runtime with one intra-op thread; raises if ORT cannot run it."""
    sess = open_session(proto, threads=1)
    arrays = {k: np.asarray(v) for k, v in feeds.items()}
    return median_seconds(lambda: sess.run(None, arrays), runs)


def torch_export(model, args, names, dynamic, dynamo: bool):
    """A bare torch.onnx.export to a ModelProto, quietly; returns (proto, seconds)."""
    t0 = time.perf_counter()
    proto = plain_export(model, args, "dynamo" if dynamo else "torchscript", names, dynamic, max_size=None)
    return proto, time.perf_counter() - t0
