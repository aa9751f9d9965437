"""Per-step label-scorer latency: one search step of B hypotheses in ONNX Runtime against eager PyTorch.

    .venv/bin/python benchmarks/label_scorer_latency.py [--exporter torchscript|dynamo] [--write docs/label_scorers.md]

One step is what RASR runs per search step for a batch of B hypotheses:
the state updater on their last labels, then the scorer (AED,
``stateful-onnx``: the updater attends over 25 encoder frames, ~1 s of
audio; LSTM transducer, ``stateful-transducer-onnx``: the prediction network,
then the joint on one encoder frame). The bundled tiny models are exported
with ``export_label_scorer`` (which proves them by decoding first); the ONNX
step runs the written graphs as RASR feeds them (int32 tokens, batch-1
encoder states, batch-first states), the eager step calls the same PyTorch
callables the way the proof's PyTorch search does. One thread each, runs
interleaved so load on the machine hits both alike; median of the rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

from onnx_compat.label_scorers import export_label_scorer  # noqa: E402
from onnx_compat.models import aed, transducer  # noqa: E402
from onnx_compat.parts.part import batch_axis  # noqa: E402
from onnx_compat.runtimes.session import open_session as session  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/label_scorers.md"}

BATCHES = (1, 4, 16)
FRAMES = 25


def _states(job, batch: int, gen: torch.Generator):
    """Random states in the user's layout at ``batch`` hypotheses, and the same batch-first as numpy."""
    user = {s.name: torch.randn([batch if not isinstance(d, int) else d for d in s.dims], generator=gen)
            for s in job["states"]}
    first = {n: np.ascontiguousarray(v.movedim(batch_axis(s, "hyps"), 0).numpy())
             for s in job["states"] for n, v in [(s.name, user[s.name])]}
    return user, first


def _steps(job, report, batch: int):
    """(ONNX step, eager step) closures for one search step of ``batch`` hypotheses."""
    gen = torch.Generator().manual_seed(batch)
    user, first = _states(job, batch, gen)
    upd, scorer = session(report.files["state-updater"]), session(report.files["scorer"])
    token = torch.randint(0, len(job["vocabulary"]), (batch,), generator=gen)
    feeds = {"token": token.numpy().astype(np.int32)}
    upd_states = job.get("updater_states") or [s.name for s in job["states"]]
    sc_states = job.get("scorer_states") or [s.name for s in job["states"]]
    feeds.update({f"{n}_in": first[n] for n in upd_states})
    enc = torch.randn(1, FRAMES, job["encoder_dim"], generator=gen)
    if job["kind"] == "stateful":
        feeds.update({"encoder_states": enc.numpy(), "encoder_states:size1": np.array([FRAMES], np.int32)})
    names = [s.name for s in job["states"]]

    def onnx_step():
        new = dict(zip([o.name for o in upd.get_outputs()], upd.run(None, feeds)))
        sc = {n: new[f"{n}_out" if n in upd_states else n] for n in sc_states}
        if job["kind"] != "stateful":
            sc["input_feature"] = enc[:, 0].numpy()
        return scorer.run(None, sc)

    @torch.no_grad()
    def eager_step():
        args = [user[n] for n in upd_states]
        if job["kind"] == "stateful":
            out = job["update"](token, enc.expand(batch, -1, -1), torch.full((batch,), FRAMES, dtype=torch.int32), *args)
        else:
            out = job["update"](token, *args)
        new = dict(zip(names, out))
        frame = [] if job["kind"] == "stateful" else [enc[:, 0].expand(batch, -1)]
        return -job["score"](*frame, *[new[n] for n in sc_states])
    return onnx_step, eager_step


def _median_pair(onnx_step, eager_step, rounds: int, runs: int):
    for _ in range(3):
        onnx_step(), eager_step()
    a, b = [], []
    for _ in range(rounds):
        for fn, out in ((onnx_step, a), (eager_step, b)):
            t0 = time.perf_counter()
            for _ in range(runs):
                fn()
            out.append((time.perf_counter() - t0) / runs)
    return statistics.median(a), statistics.median(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", default="torchscript")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=50)
    add_write_option(parser, "label-scorer latency", "docs/label_scorers.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = ["| model (label scorer) | B | ONNX Runtime step | eager PyTorch step | ORT / eager |", "|---|---|---|---|---|"]
    jobs = {"AED (stateful-onnx)": aed.label_scorer_job("stateful"),
            "LSTM transducer (stateful-transducer-onnx)": transducer.label_scorer_job("transducer")}
    with tempfile.TemporaryDirectory() as tmp:
        for name, job in jobs.items():
            report = export_label_scorer(os.path.join(tmp, job["kind"]), exporter=args.exporter, **job)
            for batch in BATCHES:
                ort_s, eager_s = _median_pair(*_steps(job, report, batch), args.rounds, args.runs)
                rows.append(f"| {name} | {batch} | {ort_s * 1e3:.3f} ms | {eager_s * 1e3:.3f} ms | {ort_s / eager_s:.2f}x |")
                print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_marked(args.write, table, "label_scorer_latency")


if __name__ == "__main__":
    main()
