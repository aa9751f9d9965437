"""ONNX Runtime outside this Python: another interpreter's ``onnxruntime``, or Node.js' ``onnxruntime-node``.

A model verified here may still not load where it is deployed: the C++
server pins an older ONNX Runtime. ``verify(..., runtimes=[...])`` runs the
same inputs through each runtime given, in a subprocess that loads the model
from its file, and compares with eager PyTorch here (the same masked
comparison as the local check). Tensors travel as ``.npy`` files (raw
little-endian bytes plus a JSON manifest for Node.js).

``python_runtime("/path/venv/bin/python")`` and ``node_runtime(folder)``
check up front that the runtime is there and say which release it is, so a
wrong path is one clear error before anything is exported.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from onnx_compat.errors import ArgumentTypeError, RuntimeUnavailable

_PY_RUN = r"""
import json, sys
import numpy as np
import onnxruntime as ort
model, folder = sys.argv[1], sys.argv[2]
names = json.load(open(folder + "/inputs.json"))
sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
wanted = {i.name for i in sess.get_inputs()}
feeds = {n: np.load(f"{folder}/in{i}.npy") for i, n in enumerate(names) if n in wanted}
outs = sess.run(None, feeds)
for i, a in enumerate(outs):
    np.save(f"{folder}/out{i}.npy", a)
json.dump([o.name for o in sess.get_outputs()], open(folder + "/outputs.json", "w"))
"""

_NODE_RUN = r"""
const fs = require('fs');
const ort = require('onnxruntime-node');
const [model, folder] = process.argv.slice(2);  // node script.js model folder
const ARRAYS = {float32: Float32Array, int32: Int32Array, int64: BigInt64Array, float64: Float64Array,
                uint8: Uint8Array, bool: Uint8Array};
(async () => {
  const manifest = JSON.parse(fs.readFileSync(folder + '/inputs.json'));
  const session = await ort.InferenceSession.create(model);
  const feeds = {};
  for (const t of manifest.filter((t) => session.inputNames.includes(t.name))) {
    const buf = fs.readFileSync(folder + '/' + t.file);
    const data = new ARRAYS[t.dtype](buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
    feeds[t.name] = new ort.Tensor(t.dtype, data, t.dims);
  }
  const results = await session.run(feeds);
  const out = session.outputNames.map((name, i) => {
    const r = results[name];
    fs.writeFileSync(`${folder}/out${i}.bin`, Buffer.from(r.data.buffer, r.data.byteOffset, r.data.byteLength));
    return {name, dtype: r.type, dims: r.dims.map(Number), file: `out${i}.bin`};
  });
  fs.writeFileSync(folder + '/outputs.json', JSON.stringify(out));
})().catch((e) => { console.error(String(e && e.message || e)); process.exit(3); });
"""


@dataclass
class Runtime:
    """One ONNX Runtime outside this process: ``kind`` "python" or "node"."""

    kind: str
    command: Tuple[str, ...]
    version: str
    env: Dict[str, str]

    @property
    def name(self) -> str:
        return f"onnxruntime {self.version} ({'Python' if self.kind == 'python' else 'Node.js'}: {self.command[0]})"

    def run(self, model_path: str, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Outputs by name of the model at ``model_path`` on ``feeds``, computed in this runtime."""
        with tempfile.TemporaryDirectory(prefix="onnx_compat_rt_") as folder:
            names = list(feeds)
            if self.kind == "python":
                for i, n in enumerate(names):
                    np.save(os.path.join(folder, f"in{i}.npy"), np.ascontiguousarray(feeds[n]))
                with open(os.path.join(folder, "inputs.json"), "w") as f:
                    json.dump(names, f)
            else:
                manifest = []
                for i, n in enumerate(names):
                    a = np.ascontiguousarray(feeds[n])
                    a.astype(a.dtype.newbyteorder("<")).tofile(os.path.join(folder, f"in{i}.bin"))
                    manifest.append({"name": n, "dtype": a.dtype.name, "dims": list(a.shape), "file": f"in{i}.bin"})
                with open(os.path.join(folder, "inputs.json"), "w") as f:
                    json.dump(manifest, f)
            command = list(self.command)
            if self.kind == "node":  # a script file: ``node -e`` numbers its arguments differently
                with open(os.path.join(folder, "run.js"), "w") as f:
                    f.write(_NODE_RUN)
                command = [command[0], os.path.join(folder, "run.js")]
            done = subprocess.run([*command, os.fspath(model_path), folder], env=self.env,
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
                raise RuntimeError(f"{self.name}: {lines[-1] if lines else f'exit code {done.returncode}'}")
            with open(os.path.join(folder, "outputs.json")) as f:
                listed = json.load(f)
            if self.kind == "python":
                return {n: np.load(os.path.join(folder, f"out{i}.npy")) for i, n in enumerate(listed)}
            return {t["name"]: np.fromfile(os.path.join(folder, t["file"]), dtype=np.dtype(t["dtype"]).newbyteorder("<"))
                    .reshape(t["dims"]) for t in listed}


def python_runtime(python: str) -> Runtime:
    """ONNX Runtime as ``python`` (another venv's interpreter) imports it."""
    exe = shutil.which(python) or python
    try:
        done = subprocess.run([exe, "-c", "import numpy, onnxruntime; print(onnxruntime.__version__)"],
                              capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise RuntimeUnavailable(f"runtime interpreter {python!r} cannot be started: {exc}") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeUnavailable(f"runtime interpreter {python!r} cannot import onnxruntime and numpy: {last}")
    return Runtime("python", (exe, "-c", _PY_RUN), done.stdout.strip().splitlines()[-1], dict(os.environ))


def node_runtime(folder: str, node: str = "node") -> Runtime:
    """``onnxruntime-node`` installed under ``folder`` (``npm install --prefix folder onnxruntime-node``)."""
    exe = shutil.which(node)
    if exe is None:
        raise RuntimeUnavailable(f"Node.js ({node!r}) is not installed")
    modules = os.path.join(os.path.abspath(folder), "node_modules")
    package = os.path.join(modules, "onnxruntime-node", "package.json")
    if not os.path.exists(package):
        raise RuntimeUnavailable(f"no onnxruntime-node under {folder!r} (npm install --ignore-scripts --prefix "
                                 f"{folder} onnxruntime-node)")
    with open(package) as f:
        version = json.load(f)["version"]
    env = dict(os.environ, NODE_PATH=modules)
    probe = subprocess.run([exe, "-e", "require('onnxruntime-node')"], env=env, capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeUnavailable(f"onnxruntime-node {version} under {folder!r} does not load: {last}")
    return Runtime("node", (exe,), version, env)


def as_runtimes(runtimes: Sequence) -> List[Runtime]:
    """``Runtime`` objects, interpreter paths (Python) or ``"node:<folder>"`` strings, checked now."""
    out = []
    for r in runtimes or ():
        if isinstance(r, Runtime):
            out.append(r)
        elif isinstance(r, str) and (r == "openvino" or r.startswith("openvino:")):
            from onnx_compat.runtimes.openvino import openvino_runtime
            out.append(openvino_runtime(*r.split(":", 1)[1:]))
        elif isinstance(r, str) and r.startswith("node:"):
            out.append(node_runtime(r[len("node:"):]))
        elif isinstance(r, (str, os.PathLike)):
            out.append(python_runtime(os.fspath(r)))
        else:
            raise ArgumentTypeError(f"runtimes: expected interpreter paths, 'node:<folder>' or Runtime, got {r!r}",
                                    argument="runtimes", value=r)
    return out
