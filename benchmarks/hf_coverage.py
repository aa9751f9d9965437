"""Every model type x task that ``families.py`` claims, exported and verified: the coverage table, measured.

    .venv/bin/python benchmarks/hf_coverage.py [--exporter torchscript] [--types wav2vec2 whisper ...]

For each pair, a tiny random-init checkpoint (``tiny.py``) goes through
``export_pretrained`` (the pipeline's verification at three new shapes, B=1
among them, against transformers' eager model with the mask built from the
lengths). Prints a Markdown table: the exporter that made the model, nodes,
the largest verification error and the output's scale, or the error.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(__file__))
from readme_block import add_write_option, write_marked  # noqa: E402

from onnx_compat.huggingface import export_pretrained, families, from_pretrained_dir, tiny  # noqa: E402
from onnx_compat.spec import make_inputs, verification_sizes  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/huggingface.md"}


def output_scale(path: str, job_inputs) -> float:
    """The largest absolute output value at the first verification shape: how much an error of 1e-7 means."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sizes = verification_sizes(job_inputs, {d.name: d.example or 3 for s in job_inputs for d in s.dims
                                            if hasattr(d, "name")})[0]
    feeds = {k: v.numpy() for k, v in make_inputs(job_inputs, sizes).items()}
    return float(np.abs(sess.run(None, feeds)[0]).max())


def one(work: str, model_type: str, task: str, exporter: str) -> str:
    folder = tiny.checkpoint(os.path.join(work, f"{model_type}-{task}"), model_type, task)
    out = os.path.join(folder + "-onnx", "model.onnx")
    os.makedirs(os.path.dirname(out))
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = export_pretrained(folder, out, task, exporter=exporter)
    except Exception as exc:  # noqa: BLE001 - the table says what failed
        return f"| {model_type} | {task} | fails: {type(exc).__name__}: {str(exc).splitlines()[0][:160]} | | | |"
    scale = output_scale(out, from_pretrained_dir(folder, task).inputs)
    outputs = ", ".join(o["name"] for o in report.outputs)
    return (f"| {model_type} | {task} | {report.exporter}, {time.perf_counter() - t0:.1f} s | {report.nodes} | "
            f"{report.max_abs_err:.1e} (scale {scale:.1e}) | {outputs} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exporter", default="torchscript")
    p.add_argument("--types", nargs="*", default=[t for f in families.FAMILIES for t in f.model_types])
    add_write_option(p, "hf-coverage", "docs/huggingface.md")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lines = ["| model type | task | verified with | nodes | max abs err | outputs |", "|---|---|---|---:|---:|---|"]
    print("\n".join(lines))
    with tempfile.TemporaryDirectory(prefix="hf_coverage_") as work:
        for model_type in args.types:
            for task in families.supported_tasks(families.family_of(model_type), model_type):
                lines.append(one(work, model_type, task, args.exporter))
                print(lines[-1], flush=True)
    if args.write:
        write_marked(args.write, "\n".join(lines), "hf-coverage")
    return 0


if __name__ == "__main__":
    sys.exit(main())
