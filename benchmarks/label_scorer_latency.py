"""Per-step label-scorer latency: one search step of B hypotheses in ONNX Runtime against eager PyTorch.

    .venv/bin/python benchmarks/label_scorer_latency.py [--exporter torchscript|dynamo] [--part steps|kv-cache]
        [--write docs/label_scorers.md] [--tiny]

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

``--part kv-cache`` (issue 46): the bundled Transformer LM's two RASR forms side by side, at a prefix of P
labels and H hypotheses: the KV-cache step of ``state-managed-onnx`` (the transformer manager feeds the P
cached positions of each layer's keys and values and one new label; the graph returns the new position)
and the full-context step of ``full-context-onnx`` (RASR's open PR #241: the P + 1 labels, every position
recomputed), each in ONNX Runtime and in eager PyTorch (``step`` with the caches, ``full_context``), the
four interleaved in every round.
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
from onnx_compat.models import aed, label_scorer_jobs, transducer, transformer_decoder  # noqa: E402
from onnx_compat.parts.part import batch_axis  # noqa: E402
from onnx_compat.runtimes.session import open_session as session  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/label_scorers.md"}

BATCHES = (1, 4, 16)
FRAMES = 25
PREFIXES, HYPS = (1, 8, 32, 64), (4, 16)  # the KV-cache table's grid


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


def _medians(steps, rounds: int, runs: int):
    """The median time of each step, the steps interleaved in every round (load hits them alike)."""
    for _ in range(3):
        for fn in steps:
            fn()
    times = [[] for _ in steps]
    for _ in range(rounds):
        for fn, out in zip(steps, times):
            t0 = time.perf_counter()
            for _ in range(runs):
                fn()
            out.append((time.perf_counter() - t0) / runs)
    return [statistics.median(t) for t in times]


def _step_rows(tmp: str, args, batches) -> list:
    rows = ["| model (label scorer) | B | ONNX Runtime step | eager PyTorch step | ORT / eager |", "|---|---|---|---|---|"]
    jobs = {"AED (stateful-onnx)": aed.label_scorer_job("stateful"),
            "LSTM transducer (stateful-transducer-onnx)": transducer.label_scorer_job("transducer")}
    for name, job in jobs.items():
        report = export_label_scorer(os.path.join(tmp, job["kind"]), exporter=args.exporter, **job)
        for batch in batches:
            ort_s, eager_s = _medians(_steps(job, report, batch), args.rounds, args.runs)
            rows.append(f"| {name} | {batch} | {ort_s * 1e3:.3f} ms | {eager_s * 1e3:.3f} ms | {ort_s / eager_s:.2f}x |")
            print(rows[-1], flush=True)
    return rows


def _lm_steps(kv_report, full_report, model, prefix: int, hyps: int):
    """(KV-cache ORT, full-context ORT, KV-cache eager, full-context eager) closures: ``hyps`` hypotheses of
    ``prefix`` labels each, scoring the next label."""
    gen = torch.Generator().manual_seed(prefix * 100 + hyps)
    vocab = model.output.out_features
    history = torch.randint(1, vocab, (hyps, prefix + 1), generator=gen)
    caches = [torch.randn(hyps, prefix, model.dim, generator=gen) for _ in range(2 * len(model.layers))]
    kv, full = session(kv_report.files["scorer"]), session(full_report.files["scorer"])
    names = [s.name for s in model.state_specs()]
    kv_feeds = {"token": history[:, -1:].numpy().astype(np.int32), "token:size1": np.ones(hyps, np.int32),
                f"{names[0]}_in:size1": np.full(hyps, prefix, np.int32),
                **{f"{n}_in": c.numpy() for n, c in zip(names, caches)}}
    full_feeds = {"history": history.numpy().astype(np.int32), "history:size1": np.full(hyps, prefix + 1, np.int32)}
    ones, prefixes, sizes = torch.ones(hyps, dtype=torch.long), torch.full((hyps,), prefix), torch.full((hyps,), prefix + 1)

    @torch.no_grad()
    def kv_eager():
        return model.step(history[:, -1:], ones, prefixes, *caches)

    @torch.no_grad()
    def full_eager():
        return model.full_context(history, sizes)
    return (lambda: kv.run(None, kv_feeds), lambda: full.run(None, full_feeds), kv_eager, full_eager)


def _kv_cache_rows(tmp: str, args, prefixes, hyps_list) -> list:
    """The Transformer LM written both ways (each proven by decoding), then the grid of prefixes and
    hypotheses."""
    model = transformer_decoder.tiny_lm()
    kv_report = export_label_scorer(os.path.join(tmp, "kv"), exporter=args.exporter,
                                    **dict(label_scorer_jobs.transformer_lm(), score=model.step, module=model))
    full_report = export_label_scorer(os.path.join(tmp, "full"), exporter=args.exporter, release="full-context-pr",
                                      **dict(label_scorer_jobs.transformer_lm_full_context(),
                                             score=model.full_context, module=model))
    rows = ["| prefix P | hyps H | KV-cache step (ORT) | full-context step (ORT) | full / KV (ORT) | KV-cache step "
            "(eager) | full-context step (eager) | full / KV (eager) | ORT / eager (KV) | ORT / eager (full) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for prefix in prefixes:
        for hyps in hyps_list:
            kv_o, full_o, kv_e, full_e = _medians(_lm_steps(kv_report, full_report, model, prefix, hyps),
                                                  args.rounds, args.runs)
            rows.append(f"| {prefix} | {hyps} | {kv_o * 1e3:.3f} ms | {full_o * 1e3:.3f} ms | {full_o / kv_o:.2f}x | "
                        f"{kv_e * 1e3:.3f} ms | {full_e * 1e3:.3f} ms | {full_e / kv_e:.2f}x | {kv_o / kv_e:.2f}x | "
                        f"{full_o / full_e:.2f}x |")
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", default="torchscript")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--part", choices=["steps", "kv-cache"], action="append",
                        help="the tables to measure (default both)")
    parser.add_argument("--tiny", action="store_true", help="one run of a small grid (the smoke test; not timing)")
    add_write_option(parser, "label-scorer latency", "docs/label_scorers.md")
    args = parser.parse_args(argv)
    if args.tiny:
        args.rounds, args.runs = 1, 1
    parts = args.part or ["steps", "kv-cache"]
    torch.set_num_threads(1)
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "steps" in parts:
            tables["label_scorer_latency"] = _step_rows(tmp, args, (1,) if args.tiny else BATCHES)
        if "kv-cache" in parts:
            tables["label_scorer_kv_cache"] = _kv_cache_rows(tmp, args, (1, 8) if args.tiny else PREFIXES,
                                                             (4,) if args.tiny else HYPS)
    for name, rows in tables.items():
        print("\n".join(rows))
        if args.write:
            write_marked(args.write, "\n".join(rows), name)
    return tables


if __name__ == "__main__":
    main()
