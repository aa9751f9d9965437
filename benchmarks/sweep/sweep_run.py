"""One model of the sweep, in its own process: five exports, each outcome as one row cell.

The "plain" steps are a user's own ``torch.onnx.export`` call (names and
dynamic dims from the specs, nothing else), with or without
``onnx_compat.patched()`` around it, then the public ``verify`` at three shapes
the export never saw. The "auto" step is ``onnx_compat.export(exporter="auto")``.
Only public names of onnx_compat are used, so this file survives its renames.
"""
from __future__ import annotations

import contextlib
import io
import json
import linecache
import logging
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from typing import Dict, List, Optional

import onnx
import torch

import onnx_compat
from onnx_compat import ExportError, VerificationError, verify
from onnx_compat.pipeline.dims import axes_of
from onnx_compat.spec import Dim, dim_sizes, make_inputs

STEPS = ("vanilla_ts", "vanilla_dynamo", "patched_ts", "patched_dynamo", "auto")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRANSLATING = re.compile(r"Occurred when translating (\w+)")
_WRAPPERS = ("TorchExportError", "ConversionError", "OnnxExporterError")
_SKIP_DIRS = tuple(os.path.dirname(m.__file__) for m in (torch, onnx_compat, onnx)) + (os.path.dirname(__file__),)
_SKIP_PACKAGES = ("onnxscript", "onnx_ir", "onnxruntime")


def _names(specs) -> List[str]:
    return [n for s in specs for n in s.onnx_names]


def root_cause(exc: BaseException) -> str:
    """The exporter's real error in one line: past its wrappers, the ``<class 'X'>: ...`` line if it has one."""
    while exc.__cause__ is not None and type(exc).__name__ in _WRAPPERS:
        exc = exc.__cause__
    text = _ANSI.sub("", str(exc))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # the TorchScript exporter names the op it was translating on another line
    op = _TRANSLATING.search(text)
    suffix = f" (translating {op.group(1)})" if op and op.group(1) not in lines[0] else ""
    for line in lines:
        if line.startswith("<class '") and "'>: " in line:
            kind, _, message = line.partition("'>: ")
            return f"{kind[len('<class '):].split('.')[-1]}: {message}{suffix}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}{suffix}"


def library_frame(exc: BaseException) -> str:
    """The deepest frame of the model's own library in the exception chain: where the pattern is written."""
    found, seen = "", set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in traceback.extract_tb(exc.__traceback__):
            path = os.path.abspath(frame.filename)
            inside = path.split("site-packages" + os.sep)[-1]
            if "site-packages" in path and not path.startswith(_SKIP_DIRS) and not inside.startswith(_SKIP_PACKAGES):
                found = f"{path.split('site-packages' + os.sep)[-1]}:{frame.lineno} {(frame.line or '').strip()}"
        exc = exc.__cause__ or exc.__context__
    return found


def _export_ts(model, args, inputs, outputs) -> onnx.ModelProto:
    axes = {k: {a: d.name for a, d in v.items()} for k, v in axes_of(list(inputs) + list(outputs)).items() if v}
    buf = io.BytesIO()
    torch.onnx.export(model, args, buf, dynamo=False, input_names=_names(inputs), output_names=_names(outputs),
                      dynamic_axes=axes)
    return onnx.load_from_string(buf.getvalue())


def _export_dynamo(model, args, inputs, outputs) -> onnx.ModelProto:
    """Named ``torch.export.Dim``s, one per spec dim name, with the spec's bounds: what the docs show."""
    dims: Dict[str, object] = {}

    def torch_dim(d: Dim):
        if d.name not in dims:
            dims[d.name] = torch.export.Dim(d.name, min=d.min, **({"max": d.max} if d.max else {}))
        return dims[d.name]
    in_axes = axes_of(inputs)
    shapes = tuple({a: torch_dim(d) for a, d in in_axes[n].items()} or None for n in _names(inputs))
    program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=shapes, input_names=_names(inputs),
                                output_names=_names(outputs))
    return program.model_proto


def _baked(proto: onnx.ModelProto, specs) -> Optional[str]:
    """The first dim the specs want dynamic that the graph has as a number."""
    wanted = axes_of(specs)
    for value in list(proto.graph.input) + list(proto.graph.output):
        for axis, dim in wanted.get(value.name, {}).items():
            shape = value.type.tensor_type.shape.dim
            if axis < len(shape) and shape[axis].HasField("dim_value"):
                return f"{value.name} axis {axis} ({dim.name}) is {shape[axis].dim_value}"
    return None


def _verification_stage(message: str) -> str:
    if message.startswith("the ONNX model does not load"):
        return "load"
    return "run" if "ONNX Runtime run failed" in message else "numbers"


def plain_step(job: dict, exporter: str, patches: bool) -> dict:
    """A user's own export call (optionally patched), then ``verify`` at new shapes."""
    model, inputs, outputs = job["model"], job["inputs"], job["outputs"]
    example = dim_sizes(inputs)
    args = tuple(make_inputs(inputs, example, seed=0).values())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    export_fn = _export_ts if exporter == "torchscript" else _export_dynamo
    try:
        with contextlib.ExitStack() as stack, warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            if patches:
                stack.enter_context(onnx_compat.patched())
            proto = export_fn(model, args, inputs, outputs)
    except Exception as exc:
        return {"stage": "export", "error": root_cause(exc), "where": library_frame(exc)}
    finally:
        model.load_state_dict(state)
        model.eval()
    baked_at = _baked_at(records)
    outcome = _checked(proto, model, inputs, outputs, example)
    return {**outcome, "baked_at": baked_at} if baked_at and outcome["stage"] != "ok" else outcome


def _baked_at(records) -> List[str]:
    """Library lines where tracing turned a tensor into a Python number (TorchScript's TracerWarnings)."""
    found: List[str] = []
    for r in records:
        path = os.path.abspath(r.filename or "")
        if not issubclass(r.category, torch.jit.TracerWarning) or path.startswith(_SKIP_DIRS):
            continue
        line = f"{path.split('site-packages' + os.sep)[-1]}:{r.lineno} {linecache.getline(path, r.lineno).strip()}"
        if line not in found:
            found.append(line)
    return found[:4]


def _checked(proto, model, inputs, outputs, example) -> dict:
    baked = _baked(proto, list(inputs) + list(outputs))
    if baked:
        return {"stage": "dims", "error": baked, "nodes": len(proto.graph.node)}
    try:
        verify(proto, model, inputs, outputs, example=example)
    except VerificationError as exc:
        message = str(exc)
        return {"stage": _verification_stage(message), "error": message.splitlines()[0], "nodes": len(proto.graph.node)}
    except Exception as exc:  # eager itself fails at a verification shape
        return {"stage": "eager", "error": root_cause(exc), "where": library_frame(exc)}
    return {"stage": "ok", "nodes": len(proto.graph.node)}


_ATTEMPTS = re.compile(r"^no exporter produced a verified model[^:]*: dynamo: (.*?); torchscript: (.*)$")


def auto_step(job: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = onnx_compat.export(job["model"], os.path.join(tmp, "m.onnx"), job["inputs"], job["outputs"],
                                        exporter="auto")
        except ExportError as exc:
            first, *rest = str(exc).splitlines()
            found = _ATTEMPTS.match(first)
            attempts = {"dynamo": found.group(1), "torchscript": found.group(2)} if found else {"error": first}
            return {"stage": "failed", "error": first, "attempts": attempts, "culprits": rest,
                    "where": library_frame(exc)}
        except Exception as exc:
            return {"stage": "failed", "error": root_cause(exc), "where": library_frame(exc), "attempts": {}}
    failed = {a.exporter: a.error for a in report.attempts if not a.ok}
    return {"stage": "ok", "exporter": report.exporter, "max_err": report.max_abs_err, "nodes": report.nodes,
            "attempts": failed}


def run_step(job: dict, step: str) -> dict:
    if step == "auto":
        return auto_step(job)
    return plain_step(job, "torchscript" if step.endswith("_ts") else "dynamo", step.startswith("patched"))


@contextlib.contextmanager
def _quiet():
    """Exporter chatter (warnings, progress lines, registration logs) would drown the sweep's own lines."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)


def code_version() -> str:
    """The last commit of the onnx_compat package a step ran with ("+dirty" with local changes): rows of
    several runs are merged, and a row's patterns may only lean on steps measured with the same code."""
    import subprocess
    package = os.path.dirname(onnx_compat.__file__)
    try:
        head = subprocess.run(["git", "-C", package, "log", "-1", "--format=%h", "--", "."], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", package, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _save(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, path)


def child(name: str, out: str, steps=STEPS) -> None:
    """Run the steps on one model, each on a fresh build (same seed): a step must not see what an earlier
    one left in the model (rotary-embedding-torch caches its frequencies at the traced length, so a later
    trace takes the cached branch and bakes that length). Saved after each step, so a timeout keeps what
    finished."""
    from sweep_models import ENTRIES
    torch.set_num_threads(1)
    entry = ENTRIES[name]
    code = code_version()
    result = {"model": name, "library": entry.library, "kind": entry.kind, "steps": {}, "running": None}
    _save(out, result)
    for step in steps:
        try:
            with _quiet():
                job = entry.build()
                job["model"].eval()
        except Exception as exc:
            result["build"] = {"error": root_cause(exc), "where": library_frame(exc)}
            _save(out, result)
            return
        result["running"] = step
        _save(out, result)
        t0 = time.perf_counter()
        with _quiet():
            outcome = run_step(job, step)
        outcome["seconds"] = round(time.perf_counter() - t0, 1)
        outcome["code"] = code
        result["steps"][step] = outcome
        result["running"] = None
        _save(out, result)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    child(sys.argv[1], sys.argv[2], tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else STEPS)
