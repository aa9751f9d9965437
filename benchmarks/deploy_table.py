"""The deploy table of docs/deploying.md: bundled models exported for an old ONNX Runtime, verified where they deploy.

    .venv/bin/python benchmarks/deploy_table.py [--target onnxruntime==1.16] [--python .venv-ort116/bin/python]
                                                [--node .node-ort] [--write docs/deploying.md]

Each bundled model is exported with each exporter for ``--target`` and
verified at three unseen shapes here, in ``--python``'s ONNX Runtime and in
``--node``'s onnxruntime-node (``make runtimes`` builds both). A runtime that
is not there is left out of the table. ``--write`` replaces the table between
the ``<!-- deploy -->`` markers of the page.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import onnx_compat
from onnx_compat.pipeline.capture import HAS_DYNAMO
from onnx_compat.models import audio, blstm, conformer
from onnx_compat.runtimes import RuntimeUnavailable, as_runtimes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/deploying.md", "needs": "`make runtimes`"}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = {
    "Conformer (tiny)": conformer.tiny,
    "BLSTM": lambda: blstm.build(hidden=32),
    "log-mel front-end": audio.frontend,
    "ISTFT vocoder": audio.vocoder,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="onnxruntime==1.16")
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv-ort116", "bin", "python"))
    parser.add_argument("--node", default=os.path.join(ROOT, ".node-ort"))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"] if HAS_DYNAMO else ["torchscript"])
    add_write_option(parser, "deploy", "docs/deploying.md")
    args = parser.parse_args(argv)
    runtimes = []
    for spec in (args.python, f"node:{args.node}"):
        try:
            runtimes += as_runtimes([spec])
        except RuntimeUnavailable as exc:
            print(f"left out: {exc}")
    names = ["here"] + [r.name.split(" (")[0] + (" (Node.js)" if r.kind == "node" else "") for r in runtimes]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for exporter in args.exporters:
                job = MODELS[model]()
                report = onnx_compat.export(job["model"], os.path.join(tmp, "m.onnx"), job["inputs"], job["outputs"],
                                            exporter=exporter, target=args.target, runtimes=runtimes)
                cells = []
                for where in [None] + [r.name for r in runtimes]:
                    checks = [c for c in report.verification if c["runtime"] == where]
                    err = max(o["max_abs_err"] for c in checks for o in c["outputs"])
                    cells.append(f"{len(checks)}/{len(checks)} ok, {err:.1e}" if all(c["ok"] for c in checks)
                                 else "FAILED")
                rows.append((model, exporter, f"{report.opset['ai.onnx']} / {report.ir_version}", *cells))
    import onnxruntime
    names[0] = f"onnxruntime {onnxruntime.__version__} (here)"
    lines = ["| model | exporter | opset / IR | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"target {args.target}; each cell: shapes verified (B=1 included) and the max abs err against eager"]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "deploy")
    return rows


if __name__ == "__main__":
    main()
