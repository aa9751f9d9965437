"""The verified export against the bare one on encoders nobody tuned for, tiny and mid-size, stage by stage.

    .venv/bin/python benchmarks/unseen_encoders.py [--tiny] [--rounds N] [--only NAME] [--sets zoo,mid]
        [--exporter torchscript|dynamo|torchscript,dynamo] [--write docs/benchmarks.md]

(``--exporter dynamo`` alone writes its own block, ``unseen-encoders-dynamo``.)

Issue #40: the pipeline met its 1.5x target on the models it was tuned on
and took 2.19x on a 12-block speech encoder it had not seen. This runs the
same comparison over attention, convolution and recurrent encoders of the
zoo (``onnx_compat/models/zoo.py``: transformers' speech encoders,
lucidrains' Conformer, the bundled BLSTM; tiny configs) and, issue #50, over
mid-size encoders (``mid_size``: about 10, 25 and 100 MiB of weights, past
``weights.ON_DISK_FROM``): a BLSTM 2 x 256, an encoder of its own (below: 12
blocks, C=256, time-first ``nn.MultiheadAttention`` with a key padding mask,
depthwise ``Conv1d(k=32, padding="same")``, LayerNorm, GELU FFN; B=2, T=200;
unlike ``mha_encoder.py``: batch-first, k=15, SiLU) and the bundled Conformer
at 16 x 256.

For each model, in one process, one torch thread, rounds interleaved (bare,
then ours, then bare, ...): the bare ``torch.onnx.export`` written to a file
as a user's own call does (under ``patched()`` only where the unpatched
export fails: marked), and ``onnx_compat.export`` with the same exporter. The
clock is the process's CPU time by default (the machine is shared: wall time
there is mostly other processes' turns); the ratio is median(ours) /
median(bare). Each stage's CPU seconds are read in the thread that runs it
(``stage_clock``): export (capture under the patches), repair, cleanup
(ONNX Runtime's optimiser, in a second thread), eager (the unpatched model on
the example and at the three verification shapes), ORT (the graph at those
shapes), writing. "proof / bare" is eager + ORT over the bare export: the
part of the ratio that verification at three shapes costs whatever else is
cut; "1 + proof" is the ratio with everything else at the bare export's cost (a floor unless the capture
under the patches is cheaper than the bare export, as ``mha_compact`` makes it on the attention encoder).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline import dims  # noqa: E402
from onnx_compat.pipeline.subject import Subject  # noqa: E402
from onnx_compat.pipeline.vanilla import plain_export  # noqa: E402
from onnx_compat.pipeline.weights import weight_bytes  # noqa: E402
from onnx_compat.spec import Dim, TensorSpec  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/benchmarks.md"}

TARGET = {"torchscript": 1.5, "dynamo": 1.1}  # ours / bare, issue #50
CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
# the zoo's attention / convolution / recurrent encoders that run in the test environment
ZOO = ("transformers LasrEncoder", "transformers SeamlessM4TSpeechEncoder", "transformers ParakeetEncoder",
       "transformers Wav2Vec2ConformerModel", "transformers Mimi (encode)", "lucidrains conformer.Conformer",
       "onnx_compat BLSTM")  # not the ECAPA: its pooling verifies only under dynamo (docs/models.md)


class Block(nn.Module):
    """Time-first attention with a key padding mask, an even-kernel depthwise conv, a GELU feed-forward."""

    def __init__(self, dim: int, heads: int, kernel: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads)  # batch_first=False: [T, B, C]
        self.conv = nn.Conv1d(dim, dim, kernel, padding="same", groups=dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(3))

    def forward(self, x, pad_mask):  # x: [T, B, C]
        h = self.norms[0](x)
        x = x + self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=False)[0]
        h = self.norms[1](x).permute(1, 2, 0)  # [B, C, T]
        x = x + self.conv(h).permute(2, 0, 1)
        return x + self.ff(self.norms[2](x))


class TimeFirstEncoder(nn.Module):
    def __init__(self, features: int = 80, dim: int = 256, blocks: int = 12, heads: int = 4, kernel: int = 32):
        super().__init__()
        self.inp = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kernel) for _ in range(blocks))
        self.out = nn.LayerNorm(dim)

    def forward(self, data, lengths):
        pad_mask = torch.arange(data.shape[1], device=data.device)[None, :] >= lengths[:, None]
        x = self.inp(data).transpose(0, 1)
        for block in self.blocks:
            x = block(x, pad_mask)
        return self.out(x).transpose(0, 1), lengths


def own_encoder(tiny: bool = False, seed: int = 0) -> dict:
    """The encoder above at C=256, 12 blocks (``tiny``: 2 x 32), B=2, T=200 example."""
    torch.manual_seed(seed)
    dim, blocks = (32, 2) if tiny else (256, 12)
    batch = Dim("batch")
    return {"model": TimeFirstEncoder(dim=dim, blocks=blocks, heads=4).eval(),
            "inputs": [TensorSpec("data", [batch, Dim("time"), 80], lengths=[1])],
            "outputs": [TensorSpec("output", [batch, Dim("time"), dim], lengths=[1])],
            "sizes": {"batch": 2, "time": 200}}


def mid_size(tiny: bool = False) -> dict:
    """``{label: job}``: encoders of the size people train (issue #50: about 10, 25 and 100 MiB of weights),
    so the weights pass ``weights.ON_DISK_FROM`` (16 MiB) and the cleanup has weights to rewrite. ``tiny``:
    the same builders at a few hundred KiB, for the smoke test."""
    from onnx_compat.models import blstm, conformer
    found = {}
    hidden, layers = (32, 2) if tiny else (256, 2)
    torch.manual_seed(0)
    model = blstm.BLSTM(80, hidden, layers, 500).eval()
    inputs, outputs = blstm.io_specs(80, 500)
    found[f"BLSTM {layers} x {hidden}"] = {"model": model, "inputs": inputs, "outputs": outputs,
                                          "sizes": {"batch": 2, "time": 200}}
    found["time-first MHA encoder " + ("2 x 32" if tiny else "12 x 256")] = own_encoder(tiny)
    dim, blocks = (32, 2) if tiny else (256, 16)
    torch.manual_seed(0)
    model = conformer.ConformerEncoder(80, 500, dim=dim, layers=blocks, heads=4, kernel=31).eval()
    inputs, outputs = conformer.io_specs(80, 500)
    found[f"Conformer {blocks} x {dim}, kernel 31"] = {"model": model, "inputs": inputs, "outputs": outputs,
                                                       "sizes": {"batch": 2, "time": 400}}
    return found


def models(tiny: bool, sets=("zoo", "mid")):
    """``{label: job}``: the zoo's encoders at their (tiny) zoo sizes, then the mid-size ones (``mid_size``)."""
    from onnx_compat.models.zoo import ZOO as FACTORIES
    found = {}
    for name in ZOO if "zoo" in sets else ():
        try:
            found[name] = FACTORIES[name]()
        except ImportError as exc:  # a library the environment lacks: the row says so
            found[name] = exc
    if "mid" in sets:
        found.update(mid_size(tiny))
    return found


def _bare_call(job, path, exporter: str = "torchscript"):
    """The bare export written to ``path`` as a user's own call does: returns (call, patched?)."""
    subject = Subject.build(job["model"], job["inputs"], job["outputs"], sizes=job.get("sizes"))
    subject.check_outputs()
    specs = list(subject.inputs) + list(subject.outputs)
    axes, names, outputs = dims.wanted_dynamic(specs), dims.onnx_names(subject.inputs), dims.onnx_names(subject.outputs)

    def bare(patched: bool):
        with onnx_compat.patched() if patched else contextlib.nullcontext():
            if exporter == "torchscript":
                plain_export(subject.adapter(), subject.args, exporter, names, axes, output_names=outputs, path=path)
            else:
                _bare_dynamo(subject, names, outputs, path)
    try:
        with _fds_quiet():  # a failed TorchScript export prints its whole IR from C++ (torch 2.13)
            bare(False)
        return (lambda: bare(False)), False
    except Exception:  # noqa: BLE001 - torch needs the patches here: the baseline is the bare export under them
        bare(True)
        return (lambda: bare(True)), True


def _bare_dynamo(subject, names, outputs, path) -> None:
    """``torch.onnx.export(dynamo=True)`` written to ``path``, with the dynamic shapes the pipeline gives torch
    (the adapter's inputs arrive as one ``*args``, so its shapes are one tuple: ``capture.Dynamo._shapes``)."""
    from onnx_compat.pipeline import capture
    request = capture.Request(subject.adapter(), tuple(subject.args), subject.inputs, subject.outputs)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), capture._quiet_logs():
        warnings.simplefilter("ignore")
        torch.onnx.export(request.model, request.args, path, dynamo=True,
                          dynamic_shapes=capture.Dynamo()._shapes(request), input_names=names, output_names=outputs)


@contextlib.contextmanager
def _fds_quiet():
    """stdout and stderr of the process itself (C++ writes there, not to sys.stdout) sent to /dev/null."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1), os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)


# Where the pipeline calls each stage: (module or class, attribute, stage). Timed by the CPU time of the thread
# that runs it (the cleanup runs in a second thread), a call inside another timed one counted in the outer.
STAGES = ("export", "repair", "cleanup", "eager", "ORT", "writing")


def _stage_sites():
    from onnx_compat.pipeline import capture, stages, subject, verification
    return [(capture, "run", "export"), (stages, "repair_int_types", "repair"),
            (stages, "repaired_while_exporting", "repair"), (stages, "fix_for_openvino", "repair"),
            (stages, "check_dims", "repair"), (stages, "clean_graph", "cleanup"),
            (subject.Subject, "check_outputs", "eager"), (stages, "reference_cases", "eager"),
            (verification, "reference_cases", "eager"),  # in verify's own thread when there is no cleanup
            (stages, "verify_model", "ORT"), (stages, "write", "writing")]


@contextlib.contextmanager
def stage_clock(into: dict):
    """While open, each stage's CPU seconds (``time.thread_time`` of the thread running it) add up in ``into``."""
    local = threading.local()

    def timed(fn, stage):
        def wrapper(*args, **kwargs):
            if getattr(local, "inside", False):
                return fn(*args, **kwargs)
            local.inside, t0 = True, time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                local.inside = False
                into[stage] = into.get(stage, 0.0) + time.thread_time() - t0
        return wrapper
    sites = _stage_sites()
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in sites]
    for owner, name, stage in sites:
        setattr(owner, name, timed(getattr(owner, name), stage))
    try:
        yield into
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def measure(label, job, rounds: int, clock, tmp: str, exporter: str = "torchscript") -> dict:
    """Interleaved rounds of the bare export and ``onnx_compat.export``: medians and each stage's CPU seconds."""
    bare_path, ours_path = os.path.join(tmp, "bare.onnx"), os.path.join(tmp, "ours.onnx")
    bare, patched = _bare_call(job, bare_path, exporter)
    splits = []

    def ours():
        with stage_clock({}) as split:
            report = onnx_compat.export(job["model"], ours_path, job["inputs"], job["outputs"],
                                        exporter=exporter, sizes=job.get("sizes"))
        splits.append(split)
        return report

    def timed(fn):
        t0 = clock()
        fn()
        return clock() - t0

    bare(), ours()  # warm-up: imports, first-call caches
    splits.clear()
    bare_s, ours_s = [], []
    for r in range(rounds):
        pair = [(bare_s, bare), (ours_s, ours)]
        for into, fn in (pair if r % 2 == 0 else pair[::-1]):
            into.append(timed(fn))
    split = {k: statistics.median(s.get(k, 0.0) for s in splits) for k in STAGES}
    report = ours()
    return {"label": label, "bare": statistics.median(bare_s), "ours": statistics.median(ours_s),
            "patched": patched, "split": split, "nodes": (report.nodes_before_cleanup, report.nodes),
            "mib": weight_bytes(job["model"]) / 2 ** 20, "target": TARGET[exporter]}


def row(m: dict) -> str:
    ratio = m["ours"] / m["bare"]
    s = m["split"]
    nodes = f"{m['nodes'][0]} -> {m['nodes'][1]}" if m["nodes"][0] else f"{m['nodes'][1]}"
    bare = f"{m['bare']:.2f}s" + (" (under patched(): unpatched fails)" if m["patched"] else "")
    stages = " | ".join(f"{s[k]:.2f}" for k in STAGES)
    cleanup = f"{s['cleanup'] / s['export']:.2f}x" if s["export"] else "-"
    proof = (s["eager"] + s["ORT"]) / m["bare"]
    return (f"| {m['label']} | {m['mib']:.1f} | {bare} | {m['ours']:.2f}s | **{ratio:.2f}x** | {stages} | "
            f"{cleanup} | {proof:.2f}x | {1 + proof:.2f}x | {nodes} | {'ok' if ratio <= m['target'] else 'MISSED'} (<= {m['target']}x) |")


HEADER = ["| model | MiB | bare export | onnx_compat.export | ratio | " + " | ".join(STAGES) +
          " | cleanup / export | proof / bare | 1 + proof | nodes (export -> cleaned) | target |",
          "|---|---|---|---|---|" + "---|" * len(STAGES) + "---|---|---|---|---|"]


def _exporters(text: str) -> list:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(n not in TARGET for n in names):
        raise argparse.ArgumentTypeError(f"exporters are {sorted(TARGET)}, comma separated; got {text!r}")
    return names


def _load(avg) -> str:
    return ", ".join(f"{a:.1f}" for a in avg)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="the encoder of this file at 2 x 32 (a smoke run)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", help="the models whose label contains this")
    p.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    p.add_argument("--exporter", type=_exporters, default=["torchscript"],
                   help="the exporter on both sides (dynamo: the bare torch.onnx.export(dynamo=True)); "
                        "torchscript,dynamo: each, their rows in one table")
    p.add_argument("--sets", default="zoo,mid", help="zoo (tiny configs), mid (10-100 MiB of weights), or both")
    add_write_option(p, "unseen-encoders", "docs/benchmarks.md")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    clock = CLOCK[args.clock]
    load_before = os.getloadavg()
    results, skipped = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jobs = models(args.tiny, args.sets.split(","))
        for exporter in args.exporter:
            for label, job in jobs.items():
                if args.only and args.only not in label:
                    continue
                if isinstance(job, Exception):
                    skipped.append(f"{label} ({job})")
                    continue
                shown = label + ("" if exporter == "torchscript" else f" ({exporter})")
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        results.append(measure(shown, job, args.rounds, clock, tmp, exporter))
                    except Exception as exc:  # noqa: BLE001 - one model's failure is its row, the others still run
                        skipped.append(f"{shown} (failed: {str(exc).splitlines()[0][:160]})")
                        continue
                print(row(results[-1]), flush=True)
    load_after = os.getloadavg()
    lines = [f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, 1 torch thread, "
             f"{args.clock} clock, median of {args.rounds} interleaved rounds (bare and ours alternating in one "
             f"process), load average (1, 5, 15 min) {_load(load_before)} before and {_load(load_after)} after "
             "(other jobs on the same cores); stages: CPU "
             "seconds of the thread running each (medians): export = capture under the patches, repair = int "
             "repair, OpenVINO fixes and dims check, cleanup = ONNX Runtime's optimiser, eager = the unpatched "
             "model on the example and at the three verification shapes, ORT = the graph at those shapes, "
             "writing = the file and its hash", ""] + HEADER
    lines += [row(m) for m in results]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped)]
    print("\n".join(lines))
    if args.write:  # torchscript's rows (alone or with dynamo's) in one block, dynamo's alone in their own
        block = "unseen-encoders" + ("" if "torchscript" in args.exporter else "-" + "-".join(args.exporter))
        write_marked(args.write, "\n".join(lines), block)
    return results


if __name__ == "__main__":
    main()
