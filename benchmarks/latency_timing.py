"""Side-by-side latency on a loaded machine: interleaved blocks of runs, medians, ratios.

Other sessions share the machine's two cores, so an absolute time drifts by tens of
percent within a minute. Every contender is timed in the same rounds, one block
each per round in turn, so a burst of load hits all of them alike; a block repeats
the call until it lasts ``block_seconds`` (a sub-millisecond graph is not timed by
one clock pair), and the figure is the median of the per-call times.

With one thread, the clock is the calling thread's CPU time (``time.thread_time``):
ONNX Runtime with one intra-op thread and PyTorch with ``set_num_threads(1)`` run
the whole call in that thread, and its CPU time does not count the time the
scheduler gives other processes, which on a machine loaded several times over
is most of the wall time. With more threads only wall time measures latency;
those figures are as noisy as the machine is loaded.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Mapping

import numpy as np
import torch

from onnx_compat.runtimes.session import open_session


def clock_for(threads: int) -> Callable[[], float]:
    """CPU time of this thread for one-thread runs, wall time otherwise (see the module's docstring)."""
    return time.thread_time if threads == 1 else time.perf_counter


def calls_per_block(fn: Callable[[], object], block_seconds: float, clock=time.perf_counter) -> int:
    """How many calls of ``fn`` fill one block (after a warm-up call)."""
    fn()
    t0 = clock()
    fn()
    one = max(clock() - t0, 1e-6)
    return max(1, int(block_seconds / one))


def interleaved_medians(fns: Mapping[str, Callable[[], object]], rounds: int, block_seconds: float = 0.02,
                        clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Median seconds per call of each fn, timed in the same interleaved rounds, each round in a new order
    (rotated), so no contender always follows the same one."""
    counts = {k: calls_per_block(fn, block_seconds, clock) for k, fn in fns.items()}
    names = list(fns)
    per_call: Dict[str, list] = {k: [] for k in fns}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            fn, n = fns[k], counts[k]
            t0 = clock()
            for _ in range(n):
                fn()
            per_call[k].append((clock() - t0) / n)
    return {k: statistics.median(v) for k, v in per_call.items()}


def ort_call(proto_or_bytes, feeds: Mapping[str, np.ndarray], threads: int) -> Callable[[], object]:
    """One run of the graph in ONNX Runtime (``threads=0``: its default, one per core), as a deployment
    builds it: full optimisation, prepacked weights."""
    sess = _session(proto_or_bytes, threads)
    wanted = {i.name for i in sess.get_inputs()}
    arrays = {k: np.ascontiguousarray(v) for k, v in feeds.items() if k in wanted}
    return lambda: sess.run(None, arrays)


def _session(proto_or_bytes, threads: int):
    """A session as ``ort_call`` says, with its thread pool not spinning between runs when it has more than
    one thread: a spinning pool of one contender would steal the cores of the next one timed."""
    return open_session(proto_or_bytes, threads=threads, spinning=threads == 1)


def eager_call(forward: Callable[..., object], args) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return forward(*args)
    return run
