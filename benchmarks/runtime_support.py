"""Which opset and IR version each ONNX Runtime release loads, measured: the source of ``pipeline/releases.py``.

    .venv/bin/python benchmarks/runtime_support.py [--versions 1.16.3 1.17.3 ...] [--python PY]

Each release is installed from the package registry into a scratch folder
(``pip install --target``, no dependencies) and imported by ``--python``, an
interpreter with numpy < 2 (old releases are built against numpy 1; the
torch 2.0 venv of ``make test-torch20`` has one). A one-node model (``Add``)
stamped with each opset and IR version is loaded; the highest of each that
loads is the release's row. Prints the table as the Python literal
``releases.py`` holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx
from onnx import TensorProto, helper

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None,
             "needs": "ONNX Runtime releases from the registry and a numpy<2 interpreter"}

RELEASES = ["1.15.1", "1.16.3", "1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.21.1", "1.22.1", "1.23.2", "1.24.4",
            "1.25.1", "1.26.0", "1.27.0", "1.28.0", "1.29.0", "1.30.0", "1.31.1", "1.32.0"]

_PROBE = r"""
import json, sys
import onnxruntime as ort
out = {"version": ort.__version__, "loads": {}}
for path in sys.argv[1:]:
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out["loads"][path] = None
    except Exception as exc:
        out["loads"][path] = str(exc).splitlines()[0][:200]
print(json.dumps(out))
"""


def _model(opset: int, ir: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def probe(release: str, python: str, folder: str, opsets=range(13, 33), irs=range(7, 16)) -> dict:
    target = os.path.join(folder, release)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                    f"onnxruntime=={release}"], check=True)
    paths = {}
    for opset in opsets:  # opsets at IR 7 (every release loads it): the highest opset
        paths[("opset", opset)] = os.path.join(folder, f"opset{opset}.onnx")
        onnx.save(_model(opset, 7), paths[("opset", opset)])
    for ir in irs:  # IR versions at opset 13: the highest IR
        paths[("ir", ir)] = os.path.join(folder, f"ir{ir}.onnx")
        onnx.save(_model(13, ir), paths[("ir", ir)])
    env = dict(os.environ, PYTHONPATH=target)
    done = subprocess.run([python, "-c", _PROBE, *paths.values()], env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    loads = result["loads"]
    best = {kind: max((v for (k, v), p in paths.items() if k == kind and loads[p] is None), default=None)
            for kind in ("opset", "ir")}
    return {"release": result["version"], "opset": best["opset"], "ir": best["ir"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=RELEASES)
    parser.add_argument("--python", default=os.path.join(os.path.dirname(__file__), "..", ".venv-torch20", "bin",
                                                         "python"))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for release in args.versions:
            row = probe(release, args.python, folder)
            rows.append(row)
            print(f"    \"{row['release']}\": ({row['opset']}, {row['ir']}),", flush=True)
    return rows


if __name__ == "__main__":
    main()
