"""What the spectral patches cost at inference: ONNX Runtime against eager PyTorch, ours against ONNX's own ops.

    .venv/bin/python benchmarks/spectral.py [--seconds 10] [--batch 4] [--runs 20] [--write docs/benchmarks.md]

Three computations, each timed in one run with one thread on both sides
(``torch.set_num_threads(1)``, ONNX Runtime with one intra-op thread):

* the log-mel front-end (``n_fft=512``, 25 ms windows, 10 ms hop, 80 mels) on
  16 kHz audio;
* an ISTFT head (``n_fft=1024``, hop 256; magnitude and phase -> ``polar`` ->
  ``istft``) making the same duration of 24 kHz audio;
* a 512-point ``rfft`` of frames, magnitude.

"ours" is the graph ``onnx_compat.export`` writes (both exporters; tables as
``Conv``/``ConvTranspose``/``MatMul``); "ONNX op" is the unpatched dynamo export,
which writes ONNX's ``STFT``/``DFT`` ops where it can. Every ORT output is
checked against eager before it is timed.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile

import numpy as np
import onnx
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import median_seconds, ort_latency  # noqa: E402
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.capture import HAS_DYNAMO, error_line
from onnx_compat.pipeline.vanilla import plain_export  # noqa: E402
from onnx_compat.models.audio import LogMelFrontend  # noqa: E402
from onnx_compat.spec import Dim, TensorSpec  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "fast", "writes": "docs/benchmarks.md"}


class Frontend(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = LogMelFrontend()

    def forward(self, samples):
        return self.inner(samples, torch.full(samples.shape[:1], samples.shape[1]))[0]


class IstftHead(nn.Module):
    def __init__(self, n_fft=1024, hop=256):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, mag, phase):
        return torch.istft(torch.polar(mag, phase), self.n_fft, self.hop, window=self.window)


class FrameSpectrum(nn.Module):
    def forward(self, frames):
        return torch.fft.rfft(frames).abs()


def _cases(seconds: float, batch: int):
    g = torch.Generator().manual_seed(0)
    frames = int(seconds * 24000) // 256 + 1
    return {
        "log-mel front-end": (Frontend(), (torch.rand(batch, int(seconds * 16000), generator=g) * 2 - 1,),
                              [{0: "batch", 1: "samples"}]),
        "ISTFT head": (IstftHead(), (torch.rand(batch, 513, frames, generator=g) + 0.1,
                                     (torch.rand(batch, 513, frames, generator=g) * 2 - 1) * np.pi),
                       [{0: "batch", 2: "frames"}] * 2),
        "rfft of frames": (FrameSpectrum(), (torch.randn(batch, int(seconds * 100), 512, generator=g),),
                           [{0: "batch", 1: "frames"}]),
    }


def _short(args, dynamic):
    """The export example: dynamic non-batch axes cut to a tenth (dynamo's own STFT translation takes
    minutes on 10 s of audio); timing runs at the full size, which the export never saw."""
    return tuple(_cut(t, axes) for t, axes in zip(args, dynamic))


def _cut(t, axes):
    for a in axes:
        if a:
            t = t.narrow(a, 0, min(t.shape[a], max(40, t.shape[a] // 10)))
    return t


def _ours(model, args, dynamic, exporter):
    """The graph onnx_compat.export writes (patched, cleaned up, verified)."""
    dims = {}
    inputs = [TensorSpec(f"x{i}", [dims.setdefault(axes[a], Dim(axes[a], example=t.shape[a])) if a in axes else s
                                   for a, s in enumerate(t.shape)]) for i, (t, axes) in enumerate(zip(args, dynamic))]
    with torch.no_grad():
        rank = model(*args).dim()
    outputs = [TensorSpec("y", [dims["batch"]] + [None] * (rank - 1))]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx_compat.export(model, path, inputs, outputs, exporter=exporter)
        return onnx.load(path)


def _onnx_op(model, args, dynamic, limit: int = 120):
    """The unpatched dynamo export, given ``limit`` seconds (its ISTFT translation at n_fft=1024 runs for minutes)."""
    names = [f"x{i}" for i in range(len(args))]

    def stop(*_):
        raise TimeoutError(f"the unpatched dynamo export did not finish in {limit} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(limit)
    try:
        return plain_export(model, args, "dynamo", names, dict(zip(names, dynamic)), output_names=["y"], max_size=None)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _timed(proto, model, args, runs):
    feeds = {i.name: a.numpy() for i, a in zip(proto.graph.input, args)}
    from onnx_compat.runtimes.session import open_session
    got = open_session(proto, threads=1).run(None, feeds)[0]
    with torch.no_grad():
        expected = model(*args).numpy()
    scale = np.abs(expected).max()
    err = float(np.abs(got - expected).max())
    if got.shape != expected.shape or err > 1e-4 * scale:
        raise AssertionError(f"wrong numbers: max abs err {err:.2e} (scale {scale:.2e})")
    return ort_latency(proto, feeds, runs), err / scale


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="audio duration per sequence")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--limit", type=int, default=120, help="seconds for each unpatched dynamo export (0: skip them)")
    parser.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"])
    add_write_option(parser, "spectral", "docs/benchmarks.md")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for name, (model, inputs, dynamic) in _cases(args.seconds, args.batch).items():
            model.eval()
            with torch.no_grad():
                eager = median_seconds(lambda: model(*inputs), args.runs)
            row = {"case": name, "eager": eager}
            for exporter in args.exporters:
                proto = _ours(model, _short(inputs, dynamic), dynamic, exporter)
                row[exporter], row[exporter + " err"] = _timed(proto, model, inputs, args.runs)
            if args.limit <= 0:
                row["onnx op"] = "not run"
                rows.append(row)
                continue
            try:
                row["onnx op"], _ = _timed(_onnx_op(model, _short(inputs, dynamic), dynamic, args.limit), model,
                                           inputs, args.runs)
            except Exception as exc:  # noqa: BLE001 - the outcome is the row
                row["onnx op"] = "fails: " + error_line(exc)[:60].replace("|", "/")
            rows.append(row)
    finally:
        torch.set_num_threads(threads)
    lines = ["| case | eager | ours, TorchScript | ours, dynamo | ONNX op (unpatched dynamo) | ours / ONNX op |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ms = lambda v: f"{v * 1e3:.1f} ms ({v / r['eager']:.2f}x)" if isinstance(v, float) else v  # noqa: E731
        best = min(r.get(e, np.inf) for e in args.exporters)
        ratio = f"{best / r['onnx op']:.2f}x" if isinstance(r["onnx op"], float) else "-"
        lines.append(f"| {r['case']} | {r['eager'] * 1e3:.1f} ms | {ms(r.get('torchscript', '-'))} | "
                     f"{ms(r.get('dynamo', '-'))} | {ms(r['onnx op'])} | {ratio} |")
    lines += ["", f"batch {args.batch} x {args.seconds:g} s; one thread each; torch {torch.__version__}; "
                  f"(x): time / eager; relative max errors of ours: "
                  + ", ".join(f"{r['case']} {r[args.exporters[0] + ' err']:.0e}" for r in rows)]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "spectral")
    return rows


if __name__ == "__main__":
    main()
