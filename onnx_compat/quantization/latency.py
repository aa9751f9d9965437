"""Is the quantized model faster than the float one here, and how much of it is quantized at all.

int8 and float16 are chosen for speed and size; neither is a given on a CPU
(int8-static and fp16 ran 1.11x and 1.13x slower than float on a 1.8 M
parameter Transformer at one thread, and exclusion can leave most weights in
float32). Both models run on the same inputs in alternation, one thread each,
after one warm-up run each, so the machine's load hits both alike; the medians
and their ratio go in the report. ``run_interleaved`` is the one place that
reads the clock (tests replace it to supply timings).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import onnx

ROUNDS = 7  # interleaved runs of each model
SLOWER = 1.05  # a quantized model this much slower than float is worth a warning (timing noise stays below)
MOST = 0.5  # share of the weight values left in float32 above which a warning says so


def run_interleaved(runs: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, List[float]]:
    """Each callable once to warm up, then ``rounds`` rounds calling each in turn: seconds per call."""
    for run in runs.values():
        run()
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return times


def compare(float_run: Callable[[], object], quantized_run: Callable[[], object], rounds: int = ROUNDS) -> dict:
    """Medians of interleaved runs: ``{"float_s", "quantized_s", "ratio", "rounds", "threads", "spread"}``."""
    return compare_many(float_run, {"quantized": quantized_run}, rounds)["quantized"]


def spread(times: List[float]) -> float:
    """The interquartile range of ``times`` over their median: how much the same run moves here (a lead
    between two models smaller than this is not one)."""
    if len(times) < 4 or statistics.median(times) <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4)
    return round((q3 - q1) / statistics.median(times), 4)


def compare_many(float_run: Callable[[], object], runs: Dict[str, Callable[[], object]],
                 rounds: int = ROUNDS) -> Dict[str, dict]:
    """Several quantized models and the float one in one interleaved loop (``auto``'s candidates): for each
    name, ``compare``'s dict against the float median of the same loop, so the ratios compare."""
    if "float" in runs:
        raise ValueError("'float' names the float model's run")
    times = run_interleaved({"float": float_run, **runs}, rounds)
    slow, noise = statistics.median(times["float"]), spread(times["float"])
    found = {}
    for name in runs:
        fast = statistics.median(times[name])
        found[name] = {"float_s": slow, "quantized_s": fast, "ratio": round(fast / slow, 4) if slow > 0 else None,
                       "rounds": rounds, "threads": 1, "spread": noise}
    return found


def float_weight_share(proto: onnx.ModelProto) -> Optional[float]:
    """Share of the weight values (initializers of 16 values or more) still float32 in ``proto``."""
    total = left = 0
    for tensor in proto.graph.initializer:
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        if count < 16:
            continue  # scales, zero points, shapes
        total += count
        left += count if tensor.data_type == onnx.TensorProto.FLOAT else 0
    return left / total if total else None


def warnings_for(recipe: str, latency: dict, share: Optional[float], excluded: List[str],
                 sizes: Optional[dict] = None) -> List[str]:
    """What a user would want to know before deploying the model written (``sizes``: the report's ``bytes``)."""
    found = []
    if sizes and sizes.get("ratio", 0) >= 1:
        found.append(f"{recipe} wrote a file no smaller than the float model: {sizes['ratio']:.2f}x its size "
                     f"({sizes['quantized']} bytes against {sizes['float']}); the scales, zero points and "
                     "quantize nodes it adds outweigh the weights it shrinks in this model")
    ratio = latency.get("ratio")
    if ratio is not None and ratio > SLOWER:
        found.append(f"{recipe} is slower than the float model here: {ratio:.2f}x its time (median of "
                     f"{latency['rounds']} interleaved runs, 1 thread); it saves size, not time, on this machine")
    if share is not None and share > MOST:
        why = (f"exclusion kept {len(excluded)} node(s) in float ({', '.join(excluded[:4])}"
               f"{', ...' if len(excluded) > 4 else ''})" if excluded else
               f"{recipe} does not quantize the ops that hold them (another recipe may: see RECIPES)")
        found.append(f"{share:.0%} of the weight values stay float32: {why}")
    return found
