"""Float vs each quantization recipe, side by side in one run: file size, ONNX Runtime latency, quality.

    .venv/bin/python benchmarks/quantize.py [--tiny] [--runs 20] [--recipes int8-dynamic,fp16]
                                            [--write docs/quantize.md]

Models: the bundled Conformer at its benchmark size (12 x 256, ``conformer.base``),
the bundled BLSTM (3 x 256 per direction, 1000 classes), the ISTFT vocoder head
(``audio.vocoder``) and two transformers encoders from the zoo at their tiny
zoo sizes (LasrEncoder, ParakeetEncoder; skipped when transformers is
missing). Each is exported (TorchScript) and verified, then every recipe runs
through ``onnx_compat.quantize()`` with its default thresholds (SNR >= 20 dB,
cosine >= 0.99; top-1 frame agreement >= 0.95 for log-prob outputs) and at
most 8 nodes of automatic exclusion. A recipe that misses them is reported
with the error, not written.

Latency: median seconds per run of the written file in ONNX Runtime (CPU) on
one input of a deployment size (B=1; 500 feature frames, 200 mel frames for
the vocoder), with one intra-op thread and with ONNX Runtime's default thread
count; "x float" is the ratio to the float model. The models of one row group
run in turn within each round (float, recipe 1, recipe 2, ..., again), so a
change in the shared machine's load falls on all of them alike.
Quality is the worst over the checked shapes (B=1 and others) against the
float ONNX model.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.models import audio, blstm, conformer, zoo  # noqa: E402
from onnx_compat.quantization import RECIPE_NAMES, QuantizationError, quantize  # noqa: E402
from onnx_compat.runtimes.session import open_session  # noqa: E402
from onnx_compat.spec import Dim, make_inputs  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/quantize.md"}


def models(tiny: bool):
    """(label, factory, deployment sizes, measures)."""
    rows = [
        ("Conformer 12x256" if not tiny else "Conformer (tiny)", conformer.tiny if tiny else conformer.base,
         {"batch": 1, "time": 100 if tiny else 500}, ["snr", "cosine", "top1"]),
        ("BLSTM 3x256" if not tiny else "BLSTM (tiny)",
         (lambda: blstm.build(hidden=16)) if tiny else (lambda: blstm.build(hidden=256, layers=3, classes=1000)),
         {"batch": 1, "time": 100 if tiny else 500}, ["snr", "cosine", "top1"]),
        ("ISTFT vocoder head", audio.vocoder, {"batch": 1, "time": 50 if tiny else 200}, ["snr", "cosine"]),
    ]
    if tiny:
        return rows
    try:
        import transformers  # noqa: F401
    except ImportError:
        return rows
    return rows + [("transformers LasrEncoder (zoo)", zoo.lasr_encoder, {"batch": 1, "time": 500}, ["snr", "cosine"]),
                   ("transformers ParakeetEncoder (zoo)", zoo.parakeet_encoder, {"batch": 1, "time": 500},
                    ["snr", "cosine"])]


def latencies(paths, feeds: dict, threads: int, runs: int, warmup: int = 3):
    """Median seconds per run of each model, the models run in turn within every round, so a change in the
    machine's load (it is shared) falls on all of them alike. ``threads`` 0: ONNX Runtime's default."""
    runners = []
    for path in paths:
        sess = open_session(path, threads=threads)
        types = {i.name: np.float16 if i.type == "tensor(float16)" else None for i in sess.get_inputs()}
        arrays = {k: v.astype(types[k]) if types.get(k) is not None else v for k, v in feeds.items()}
        runners.append(lambda sess=sess, arrays=arrays: sess.run(None, arrays))
    times = [[] for _ in runners]
    for round_ in range(warmup + runs):
        for run, spent in zip(runners, times):
            t0 = time.perf_counter()
            run()
            if round_ >= warmup:
                spent.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def deployment_feeds(job, sizes):
    """One input at ``sizes`` (dims of other names, e.g. samples, keep their example size)."""
    named = {d.name for s in job["inputs"] for d in s.dims if isinstance(d, Dim)}
    full = {n: sizes.get(n, 3 if n == "batch" else 37) for n in named}
    return {k: v.numpy() for k, v in make_inputs(job["inputs"], full, seed=5).items()}


def quality(report) -> str:
    worst = {}
    for c in report.verification["checks"]:
        if c["against"] == "float":
            worst[c["measure"]] = c["got"]
    return ", ".join(f"{k} {v:.1f}" if k == "snr" else f"{k} {v:.3f}" for k, v in worst.items())


def bench_model(label, factory, sizes, measures, recipes, runs, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = factory()
        path = os.path.join(folder, "float.onnx")
        report = onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript")
    made, rows = [path], [[label, "float", f"{os.path.getsize(path) / 1e3:.0f} kB", "", "1.00x", "", "1.00x",
                           "(reference)", ""]]
    for recipe in recipes:
        out = os.path.join(folder, f"{recipe}.onnx")
        try:
            q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe=recipe, out=out, report=report,
                         measures=measures, exclude_limit=8)
        except QuantizationError as exc:
            rows.append([label, recipe, "-", "-", "-", "-", "-", _missed(exc), ""])
            continue
        excluded = sum(len(c["nodes"]) for c in q.excluded)
        made.append(out)
        rows.append([label, recipe, f"{q.bytes['quantized'] / 1e3:.0f} kB ({q.bytes['ratio']:.2f})", "", "", "", "",
                     quality(q), f"{excluded} nodes" if excluded else ""])
    feeds = deployment_feeds(job, sizes)
    timed = [r for r in rows if r[2] != "-"]
    for threads, column in ((1, 3), (0, 5)):
        seconds = latencies(made, feeds, threads, runs)
        for row, s in zip(timed, seconds):
            row[column], row[column + 1] = f"{s * 1e3:.2f} ms", f"{s / seconds[0]:.2f}x"
    return rows


def _missed(exc: QuantizationError) -> str:
    if exc.got is None:
        return f"error: {exc}"
    tried = f", after excluding {len(exc.excluded)} nodes" if exc.excluded else ""
    return f"missed: {exc.measure} {exc.got:.3g} (>= {exc.threshold:g}{tried})"


SLOWER = 1.05  # a ratio above this is "slower": below it, run-to-run noise

HEADER = ["model", "recipe", "file", "ORT 1 thread", "x float", "ORT default threads", "x float",
          "worst vs float ONNX", "excluded"]


def table(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def slower(rows) -> str:
    found = [f"{r[0]} {r[1]} ({r[4]} at 1 thread, {r[6]} at default threads)" for r in rows
             if r[1].startswith("int8") and r[4] != "-" and max(float(r[4][:-1]), float(r[6][:-1])) > SLOWER]
    return ("int8 slower than float (by more than 5 %) on this CPU: " + "; ".join(found) + ".") if found else \
        "int8 was not slower than float (by more than 5 %) for any model here."


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny models, few runs (a smoke test)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--recipes", default=",".join(RECIPE_NAMES))
    p.add_argument("--write", help="replace the <!-- quantize-table --> block of this markdown file")
    args = p.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    recipes = [r for r in args.recipes.split(",") if r]
    rows = []
    for label, factory, sizes, measures in models(args.tiny):
        with tempfile.TemporaryDirectory() as folder:
            rows += bench_model(label, factory, sizes, measures, recipes, args.runs, folder)
        print(f"done: {label}", file=sys.stderr)
    cpu = (f"{os.cpu_count()} CPU(s), onnxruntime {ort.__version__}, load average {os.getloadavg()[0]:.1f} "
           "at the end")
    text = f"{table(rows)}\n\n{slower(rows)} Measured on {cpu}, one run of this script."
    print(text)
    if args.write:
        write_marked(args.write, text, "quantize-table")
    return rows


if __name__ == "__main__":
    main()
