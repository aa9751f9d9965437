"""Which TorchScript graphs are worth a second (dynamo) export: the graph's share of shape bookkeeping
against the time dynamo's graph takes, measured side by side.

    .venv/bin/python benchmarks/choose_rule.py [--no-time] [--rounds N] [--only NAME ...] [--write docs/benchmarks.md]

``exporter="auto"`` keeps TorchScript's verified graph unless
``pipeline/choose.py::worth_timing`` says dynamo's may run faster: then it
exports again and times both. The rule must be read off the one graph it has
(no second export to decide whether to make one). For every model of the zoo
(``models/zoo.py``), every rewrite case of ``benchmarks/op_tail.py`` and the
tiny transformers checkpoints of issue #29's export-time budget
(``benchmarks/hf_vs_optimum.py``'s five, plus two with the base models' depth),
this prints the TorchScript graph's nodes, its share of shape bookkeeping
(``choose.bookkeeping_share``), what ``worth_timing`` says, and (unless
``--no-time``) the time of our dynamo graph over our TorchScript graph, both as
the pipeline writes them, in ONNX Runtime with one thread (CPU time of the
calling thread), interleaved rounds, at batch 4 and 4x the example's other dims;
``--passes`` times every row again after all the others (the median and the
range of the passes are shown: on a shared machine one pass can be 15% off).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass
from typing import Callable, List

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_timing import clock_for, interleaved_medians, ort_call  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.capture import HAS_DYNAMO  # noqa: E402
from onnx_compat.pipeline.choose import bookkeeping_share, worth_timing  # noqa: E402
from onnx_compat.spec import make_inputs  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/benchmarks.md"}

# the base models' structure at tiny width: 12 layers, the 7-conv feature encoder (more length arithmetic)
_BASE_DEPTH = dict(num_hidden_layers=12, conv_dim=(16,) * 7, conv_stride=(5, 2, 2, 2, 2, 2, 2),
                   conv_kernel=(10, 3, 3, 3, 3, 2, 2))
# name: (model type, task, config over tiny.py's)
HF = {
    "wav2vec2 CTC": ("wav2vec2", "ctc", None),
    "HuBERT CTC": ("hubert", "ctc", None),
    "WavLM CTC": ("wavlm", "ctc", None),
    "Whisper encoder": ("whisper", "speech-encoder", None),
    "AST classification": ("audio-spectrogram-transformer", "audio-classification", None),
    "wav2vec2 CTC, base depth": ("wav2vec2", "ctc", _BASE_DEPTH),
    "WavLM CTC, base depth": ("wavlm", "ctc", _BASE_DEPTH),
}


@dataclass
class Row:
    """One graph source: each exporter's graph (as the pipeline writes it) and the inputs to time them on."""

    kind: str
    name: str
    graphs: Callable[[str], onnx.ModelProto]
    feeds: Callable[[], dict]


def _job_row(kind: str, name: str, job: dict) -> Row:
    """A job (``{"model", "inputs", "outputs"}``): each exporter's file from ``onnx_compat.export``."""
    import runtime_latency

    def graph(exporter: str) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "m.onnx")
            onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter=exporter)
            return onnx.load(path)

    def feeds() -> dict:
        sizes = runtime_latency.timing_sizes(job["inputs"], 4)
        return {k: v.numpy() for k, v in make_inputs(job["inputs"], sizes, seed=7).items()}
    return Row(kind, name, graph, feeds)


def model_rows() -> List[Row]:
    from onnx_compat.models.zoo import ZOO
    return [_job_row("model", name, factory()) for name, factory in ZOO.items()]


def hf_rows(work: str) -> List[Row]:
    from onnx_compat.huggingface import from_pretrained_dir, tiny
    rows = []
    for name, (model_type, task, config) in HF.items():
        folder = tiny.checkpoint(os.path.join(work, name.replace(" ", "_").replace(",", "")), model_type, task,
                                 config=config)
        job = from_pretrained_dir(folder, task)
        rows.append(_job_row("transformers, item 3", name, {"model": job.model, "inputs": job.inputs,
                                                            "outputs": job.outputs}))
    return rows


def rewrite_rows() -> List[Row]:
    """The op-tail cases: the patched graph, cleaned as the pipeline cleans it, checked against eager."""
    import op_tail
    import rewrite_latency
    rows = []
    for name, (build, export, check) in op_tail.cases().items():
        def graph(exporter, build=build, export=export, check=check):
            return rewrite_latency.patched_graph(build, export, check, exporter)

        def feeds(name=name):
            return {f"x{i}": a.numpy() for i, a in enumerate(rewrite_latency._timing_args(name))}
        rows.append(Row("rewrite", name, graph, feeds))
    return rows


def _verdict(proto: onnx.ModelProto) -> str:
    why = worth_timing(proto, "torchscript")
    return "no" if why is None else "yes: " + why.split(":")[0]


def prepare(row: Row, time_it: bool) -> dict:
    """The TorchScript graph's figures, and where ``time_it`` both graphs' one-thread calls on the row's inputs."""
    out = {"row": row, "ratios": [], "error": None}
    try:
        ts = row.graphs("torchscript")
    except Exception as exc:  # noqa: BLE001 - the failure is the row
        out["error"] = f"TorchScript fails: {type(exc).__name__}"
        return out
    out.update(nodes=len(ts.graph.node), share=bookkeeping_share(ts), verdict=_verdict(ts))
    if not time_it:
        return out
    try:
        dyn = row.graphs("dynamo")
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"dynamo fails: {type(exc).__name__}"
        return out
    feeds = row.feeds()
    out.update(calls={"torchscript": ort_call(ts, feeds, 1), "dynamo": ort_call(dyn, feeds, 1)},
               dyn_nodes=len(dyn.graph.node))
    return out


def time_pass(results: List[dict], rounds: int) -> None:
    """One ratio per timed row: dynamo's median over TorchScript's, the two in the same interleaved rounds.
    Passes run one after another over all rows, so each row's passes meet the machine's load minutes apart."""
    for r in results:
        if "calls" in r:
            seconds = interleaved_medians(r["calls"], rounds, clock=clock_for(1))
            r["ratios"].append(seconds["dynamo"] / seconds["torchscript"])
            r["ts_ms"] = seconds["torchscript"] * 1e3


def line(r: dict) -> str:
    row = r["row"]
    if "share" not in r:
        return f"| {row.name} | {row.kind} | - | - | {r['error']} | - |"
    ratios = sorted(r["ratios"])
    spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    ratio = f"{statistics.median(ratios):.2f}x{spread}; {r['dyn_nodes']} nodes, TorchScript {r['ts_ms']:.2f} ms" \
        if ratios else (r["error"] or "not timed")
    return f"| {row.name} | {row.kind} | {r['nodes']} | {r['share']:.0%} | {ratio} | {r['verdict']} |"


def table(results: List[dict]) -> List[str]:
    head = ["| graph | kind | TorchScript nodes | shape bookkeeping | dynamo / TorchScript time, 1 thread | "
            "second export (`worth_timing`) |", "|---|---|---:|---:|---|---|"]
    ordered = sorted(results, key=lambda r: -r.get("share", -1))
    return head + [line(r) for r in ordered]


def main(argv=None) -> List[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-time", action="store_true", help="the graphs' figures only (no dynamo export)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--passes", type=int, default=3, help="timing passes over all rows (median and range shown)")
    p.add_argument("--only", nargs="*", help="row names")
    add_write_option(p, "choose-rule", "docs/benchmarks.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    time_it = HAS_DYNAMO and not args.no_time
    results = []
    with tempfile.TemporaryDirectory(prefix="choose_rule_") as work:
        for rows in (model_rows, rewrite_rows, lambda: hf_rows(work)):
            for row in rows():
                if args.only and row.name not in args.only:
                    continue
                results.append(prepare(row, time_it))
                print(f"{row.name}: {results[-1].get('share', results[-1]['error'])}", file=sys.stderr, flush=True)
    for k in range(args.passes if time_it else 0):
        time_pass(results, args.rounds)
        print(f"pass {k + 1}: " + ", ".join(f"{r['row'].name} {r['ratios'][-1]:.2f}" for r in results if r["ratios"]),
              file=sys.stderr, flush=True)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    timing = (f"dynamo / TorchScript: median of {args.passes} passes (range), each the ratio of medians of "
              f"{args.rounds} interleaved rounds") if time_it else "not timed"
    lines = [f"torch {torch.__version__}, onnxruntime {__import__('onnxruntime').__version__}, load average "
             f"{load}; {timing}", "", *table(results)]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "choose-rule")
    return results


if __name__ == "__main__":
    main()
