"""What putting TorchScript off saves ``export(auto)`` on cells stepped by a Python loop over time.

    .venv/bin/python benchmarks/loops_first.py [--rounds N] [--write docs/benchmarks.md]

``auto`` tries TorchScript first; on a loop over time its tracer unrolls the loop at the example, and the
conversion of the unrolled trace, its cleanup and the verification that then fails come before dynamo, which
writes the loop as a ``Scan``. ``pipeline/sized_trace.py`` finds such a trace by a second trace one step
longer and lets dynamo go first. Here ``export(auto)`` runs on the loop cells of
``onnx_compat/models/loop_cases.py`` as it is and with TorchScript's first attempt in full (``capture.AUTO``
with ``STRATEGIES[0]`` first, the order before), rounds interleaved, each in one process after a warm-up
export of each; the ratio is the median wall time of the two. Both must give dynamo's verified graph.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat import Dim, TensorSpec  # noqa: E402
from onnx_compat.models.loop_cases import SteppedCell, UnboundGRU  # noqa: E402
from onnx_compat.pipeline import capture  # noqa: E402

BENCHMARK = {"cost": "slow", "writes": "docs/benchmarks.md"}

B, T = Dim("batch"), Dim("time")
MODELS = {  # name: (model, output specs)
    "tanh cell over range(x.size(1))": (SteppedCell, [TensorSpec("y", [B, T, 6])]),
    "GRUCell over x.unbind(1)": (UnboundGRU, [TensorSpec("y", [B, T, 6]), TensorSpec("h", [B, 6])]),
}


@contextlib.contextmanager
def order(put_off: bool):
    """``auto``'s order as it is, or with TorchScript's first attempt in full (the order before)."""
    kept = capture.AUTO
    if not put_off:
        capture.AUTO = (capture.STRATEGIES[0],) + kept[1:]
    try:
        yield
    finally:
        capture.AUTO = kept


def timed(name: str, put_off: bool) -> tuple:
    """One ``export(auto)``: its wall time and the exporter it used."""
    build, outputs = MODELS[name]
    with order(put_off), tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        report = onnx_compat.export(build().eval(), os.path.join(folder, "m.onnx"), [TensorSpec("x", [B, T, 4])],
                                    outputs, exporter="auto")
        return time.perf_counter() - t0, report.exporter


def measure(rounds: int) -> list:
    rows = []
    for name in MODELS:
        timed(name, True), timed(name, False)  # warm-up: the first export of a process builds tables
        seconds = {True: [], False: []}
        for _ in range(rounds):
            for put_off in (True, False):
                took, used = timed(name, put_off)
                if used != "dynamo":
                    raise SystemExit(f"{name}: auto used {used}, not dynamo's graph")
                seconds[put_off].append(took)
        now, before = statistics.median(seconds[True]), statistics.median(seconds[False])
        rows.append((name, before, now, now / before))
    return rows


def table(rows: list, rounds: int) -> str:
    lines = [f"`export(auto)` on loop cells, median of {rounds} interleaved rounds (both write dynamo's graph):", "",
             "| model | TorchScript in full first | put off | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {before:.2f}s | {now:.2f}s | **{ratio:.2f}x** |" for name, before, now, ratio in rows]
    return "\n".join(lines)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_write_option(parser, "loops-first", "docs/benchmarks.md")
    args = parser.parse_args(argv)
    rows = measure(args.rounds)
    text = table(rows, args.rounds)
    print(text)
    if args.write:
        write_marked(args.write, text, "loops-first")
    return rows


if __name__ == "__main__":
    main()
