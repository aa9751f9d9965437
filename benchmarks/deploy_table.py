"""The README's Deploying table: bundled models exported for an old ONNX Runtime and verified where they deploy.

    .venv/bin/python benchmarks/deploy_table.py [--target onnxruntime==1.16] [--python .venv-ort116/bin/python]
                                                [--node .node-ort]

Each bundled model is exported with each exporter for ``--target`` and
verified at three unseen shapes here, in ``--python``'s ONNX Runtime and in
``--node``'s onnxruntime-node (``make runtimes`` builds both). A runtime that
is not there is left out of the table.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import onnx_compat
from onnx_compat.pipeline.capture import HAS_DYNAMO
from onnx_compat.models import audio, blstm, conformer
from onnx_compat.runtimes import RuntimeUnavailable, as_runtimes

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
    print(f"| model | exporter | opset / IR | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\ntarget {args.target}; each cell: shapes verified (B=1 included) and the max abs err against eager")
    return rows


if __name__ == "__main__":
    main()
