"""Shared timing helpers for the benchmarks: one ORT thread, median of many runs."""
from __future__ import annotations

import contextlib
import io
import statistics
import time
import warnings

import numpy as np
import onnx
import torch

from onnx_compat.exporters import _quiet_logs
from onnx_compat.verify import session


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
    sess = session(proto, threads=1)
    arrays = {k: np.asarray(v) for k, v in feeds.items()}
    return median_seconds(lambda: sess.run(None, arrays), runs)


def torch_export(model, args, names, dynamic, dynamo: bool):
    """A bare torch.onnx.export to a ModelProto, quietly; returns (proto, seconds)."""
    model.eval()
    t0 = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _quiet_logs():
        warnings.simplefilter("ignore")
        if dynamo:
            shapes = tuple({a: torch.export.Dim(n, min=1) for a, n in dynamic[name].items()} for name in names)
            proto = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=shapes, input_names=names).model_proto
        else:
            buf = io.BytesIO()
            torch.onnx.export(model, args, buf, dynamo=False, input_names=names, dynamic_axes=dynamic)
            proto = onnx.load_from_string(buf.getvalue())
    return proto, time.perf_counter() - t0
