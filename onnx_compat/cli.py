"""``onnx-compat export | verify | diagnose | inspect | repair | export-streaming | quantize``: one step of a pipeline.

Exit 0 on success; otherwise one line on stderr naming what went wrong and a
non-zero code (1 for a failed export or check, 2 for bad usage). ``diagnose``
prints its findings, the module at fault first on a ``culprit ...`` line, and
exits 1 when it found one.

A FACTORY is ``module:function``; the function returns
``{"model": nn.Module, "inputs": [TensorSpec...], "outputs": [TensorSpec...]}``
or the tuple ``(model, inputs, outputs)``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

import numpy as np
import onnx
import torch

from onnx_compat.factories import FactoryError, call_factory
from onnx_compat.graph import describe
from onnx_compat.huggingface import HFError, cli as hf_cli
from onnx_compat.api import export
from onnx_compat.pipeline.files import check_writable, write_atomically
from onnx_compat.pipeline.repair import repair_int_types
from onnx_compat.pipeline.verification import session, verify


class UsageError(Exception):
    pass


def load_factory(spec: str):
    """``(model, inputs, outputs, examples)`` from a FACTORY returning a dict or a 3-tuple."""
    job = call_factory(spec, UsageError)
    if isinstance(job, dict):
        missing = [k for k in ("model", "inputs", "outputs") if k not in job]
        if missing:
            raise UsageError(f"{spec} returned a dict without {missing}")
        return job["model"], job["inputs"], job["outputs"], job.get("examples")
    if isinstance(job, (tuple, list)) and len(job) == 3:
        return (*job, None)
    raise UsageError(f"{spec} must return {{'model', 'inputs', 'outputs'}} or (model, inputs, outputs), "
                     f"got {type(job).__name__}")


def load_examples(path: Optional[str]):
    """``--examples``: a ``.npz`` (one example, keys are ONNX input names) or a ``.pt`` (a dict or a list of dicts)."""
    if path is None:
        return None
    if path.endswith(".npz"):
        with np.load(path) as data:
            return [{k: torch.from_numpy(data[k]) for k in data.files}]
    if path.endswith(".pt"):
        loaded = torch.load(path, weights_only=True)
        return [loaded] if isinstance(loaded, dict) else loaded
    raise UsageError(f"--examples takes a .npz or .pt file, got {path!r}")


def _pairs(items: Optional[List[str]], what: str, cast=str) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} takes KEY=VALUE, got {item!r}")
        try:
            out[key] = cast(value)
        except ValueError as exc:
            raise UsageError(f"{what} {item!r}: {exc}") from exc
    return out


def _parser(verb: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line; with ``verb``, that verb's options alone, so a command loads only its own layers."""
    p = argparse.ArgumentParser(prog="onnx-compat", description="Export PyTorch models to ONNX and prove them.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, add in PARSERS.items():
        if verb in (None, name):
            add(sub)
    return p


_RUNTIME_HELP = "verify in another runtime too: a venv's python, node:FOLDER with onnxruntime-node, or openvino"


def export_parser() -> argparse.ArgumentParser:
    """The ``export`` verb's parser alone (``python -m onnx_compat.huggingface.cli`` uses it)."""
    sub = argparse.ArgumentParser(prog="onnx-compat").add_subparsers(dest="command", required=True)
    _export_parser(sub)
    return sub.choices["export"]


def _export_parser(sub) -> None:
    e = sub.add_parser("export", help="export a model from a factory (or hf:DIR), verify it, write it")
    e.add_argument("factory", help="MODULE:FACTORY, or hf:DIR for a transformers checkpoint folder")
    e.add_argument("--out", required=True, help="the .onnx file to write")
    e.add_argument("--exporter", default="auto", choices=["auto", "dynamo", "torchscript"])
    e.add_argument("--json", help="also write the report as JSON here (no progress lines then)")
    e.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    e.add_argument("--size", action="append", metavar="DIM=N", help="example size of a named dim")
    e.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="extra metadata_props")
    e.add_argument("--opset", type=int)
    e.add_argument("--atol", type=float, default=1e-4)
    e.add_argument("--rtol", type=float, default=1e-3)
    e.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime check (not recommended)")
    e.add_argument("--strict", action="store_true", help="baked constants and degenerate outputs are errors")
    e.add_argument("--rasr", action="store_true", help="require RASR's rules to hold")
    e.add_argument("--examples", help="real inputs: FILE.npz (one example) or FILE.pt (a dict or list of dicts)")
    e.add_argument("--target", help="the ONNX Runtime release the model must load in, e.g. onnxruntime==1.16")
    e.add_argument("--external-data", action="store_true", default=None,
                   help="weights in OUT.data beside the graph (automatic from 1 GiB of weights; less memory)")
    e.add_argument("--runtime", action="append", metavar="PYTHON|node:FOLDER|openvino", help=_RUNTIME_HELP)
    e.add_argument("--contract", help="a consumer's contract: rasr, sherpa-onnx/nemo-ctc, sherpa-onnx/speaker-embedding")
    e.add_argument("--vocabulary", help="the contract's tokens, one per line (blank included)")
    e.add_argument("--quantize", help="write an int8/float16 model, verified against the float one: "
                   "int8-dynamic, int8-static, fp16, ... (the float model goes beside it)")
    hf_cli.add_arguments(e)


def _verify_parser(sub) -> None:
    v = sub.add_parser("verify", help="check an ONNX file against a factory's eager model")
    v.add_argument("onnx")
    v.add_argument("factory", help="MODULE:FACTORY")
    v.add_argument("--atol", type=float, default=1e-4)
    v.add_argument("--rtol", type=float, default=1e-3)
    v.add_argument("--json")
    v.add_argument("--examples", help="real inputs to verify too: FILE.npz or FILE.pt")
    v.add_argument("--runtime", action="append", metavar="PYTHON|node:FOLDER|openvino", help=_RUNTIME_HELP)


def _diagnose_parser(sub) -> None:
    d = sub.add_parser("diagnose", help="name the module at fault: a failed export, other numbers, a baked dim")
    d.add_argument("factory", help="MODULE:FACTORY")
    d.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    d.add_argument("--size", action="append", metavar="DIM=N", help="example size of a named dim")
    d.add_argument("--examples", help="real inputs: FILE.npz or FILE.pt")
    d.add_argument("--atol", type=float, default=1e-4)
    d.add_argument("--rtol", type=float, default=1e-3)


def _inspect_parser(sub) -> None:
    i = sub.add_parser("inspect", help="I/O, dims, ops, auto_pad, metadata and RASR findings")
    i.add_argument("onnx")
    i.add_argument("--features", default="data")
    i.add_argument("--features-size", default="data:size1")
    i.add_argument("--output", default="output")
    i.add_argument("--dynamic", action="append", metavar="NAME:AXIS",
                   help="a dim meant to be dynamic (default: from onnx_compat's metadata)")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")


def _repair_parser(sub) -> None:
    r = sub.add_parser("repair", help="cast int32 operands of int64 shape arithmetic so the model loads")
    r.add_argument("onnx")
    r.add_argument("--out", required=True, help="the repaired .onnx file to write")


class Progress:
    """Each stage and the time since the start, on stderr: an export of a large model takes minutes."""

    def __init__(self, stream) -> None:
        self.stream, self.start = stream, time.perf_counter()

    def __call__(self, stage: str) -> None:
        self.stream.write(f"onnx-compat [{time.perf_counter() - self.start:6.1f}s] {stage}\n")
        self.stream.flush()


def progress_for(args) -> Optional[Progress]:
    """Progress lines only for a person watching: stderr a terminal, and neither --quiet nor --json."""
    if getattr(args, "quiet", False) or getattr(args, "json", None) or not sys.stderr.isatty():
        return None
    return Progress(sys.stderr)


def _vocabulary(path: Optional[str]) -> Optional[List[str]]:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh if line.strip()]
    except OSError as exc:
        raise UsageError(f"--vocabulary {path!r}: {exc.strerror or exc}") from exc


def _dynamic(items: Optional[List[str]]):
    if not items:
        return None
    wanted: dict = {}
    for item in items:
        name, sep, axis = item.rpartition(":")
        if not sep or not name or not axis.isdigit():
            raise UsageError(f"--dynamic {item!r}: expected NAME:AXIS, e.g. data:1")
        wanted.setdefault(name, {})[int(axis)] = f"{name}:{axis}"
    return wanted


def _inspect_text(info: dict) -> str:
    lines = [f"opset    {info['opset']}"]
    lines += [f"input    {v['name']} {v['dtype']}{v['dims']}" for v in info["inputs"]]
    lines += [f"output   {v['name']} {v['dtype']}{v['dims']}" for v in info["outputs"]]
    lines.append(f"nodes    {info['nodes']}  auto_pad {len(info['auto_pad'])}")
    lines.append("ops      " + ", ".join(f"{k} {n}" for k, n in info["ops"].items()))
    lines += [f"meta     {k} = {v}" for k, v in info["metadata"].items()]
    rasr = info["rasr"]
    lines.append("rasr     " + ("ok, fits " + "/".join(rasr["roles"]) if rasr["ok"] else "; ".join(rasr["findings"])))
    lines += [f"finding  {f}" for f in info["findings"]]
    return "\n".join(lines)


def _export(args) -> int:
    if hf_cli.is_hf_source(args.factory):
        report = hf_cli.export_from_args(args, examples=load_examples(args.examples), progress=progress_for(args),
                                         contract=args.contract, vocabulary=_vocabulary(args.vocabulary),
                                         quantize=args.quantize)
    else:
        model, inputs, outputs, examples = load_factory(args.factory)
        report = export(model, args.out, inputs, outputs, exporter=args.exporter,
                        sizes=_pairs(args.size, "--size", int), metadata=_pairs(args.metadata, "--metadata"),
                        opset=args.opset, atol=args.atol, rtol=args.rtol, verify=not args.no_verify,
                        strict=args.strict, rasr=args.rasr, examples=load_examples(args.examples) or examples,
                        target=args.target, runtimes=args.runtime or (), external_data=args.external_data,
                        progress=progress_for(args), contract=args.contract,
                        vocabulary=_vocabulary(args.vocabulary), quantize=args.quantize)
        if args.json:
            report.to_json(args.json)
    print(report.summary())
    return 0


def _verify(args) -> int:
    model, inputs, outputs, examples = load_factory(args.factory)
    results = verify(args.onnx, model, inputs, outputs, atol=args.atol, rtol=args.rtol,
                     examples=load_examples(args.examples) or examples, runtimes=args.runtime or ())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in results], fh, indent=2)
    for r in results:
        where = f" in {r.runtime}" if r.runtime else ""
        print(f"ok  {'example ' if r.example else ''}{r.sizes}{where}  "
              + ", ".join(f"{o.name} max abs err {o.max_abs_err:.2e}" for o in r.outputs))
    return 0


def _diagnose(args) -> int:
    from onnx_compat.diagnosis import diagnose
    model, inputs, outputs, examples = load_factory(args.factory)
    found = diagnose(model, inputs, outputs, exporter=args.exporter, sizes=_pairs(args.size, "--size", int),
                     examples=load_examples(args.examples) or examples, atol=args.atol, rtol=args.rtol)
    print(found.summary())
    return 1 if found.findings else 0


def _repair(args) -> int:
    proto = onnx.load(args.onnx)
    fixed, done = repair_int_types(proto)
    session(fixed)  # loads now, or raises with ONNX Runtime's reason
    write_atomically(fixed, check_writable(args.out))
    print("\n".join(f"cast     {d}" for d in done) or "nothing to repair")
    return 0


def _inspect(args) -> int:
    from onnx_compat.contracts.rasr import check_rasr
    info = describe(args.onnx, dynamic=_dynamic(args.dynamic))
    info["rasr"] = check_rasr(args.onnx, features=args.features, features_size=args.features_size or None,
                              output=args.output).to_dict()
    print(json.dumps(info, indent=2) if args.json else _inspect_text(info))
    return 0


def _streaming_cli():
    from onnx_compat.streaming import cli
    return cli


def _quantize_cli():
    from onnx_compat.quantization import cli
    return cli


PARSERS = {"export": _export_parser, "verify": _verify_parser, "diagnose": _diagnose_parser,
           "inspect": _inspect_parser, "repair": _repair_parser,
           "export-streaming": lambda sub: _streaming_cli().add_parser(sub),
           "quantize": lambda sub: _quantize_cli().add_parser(sub)}
VERBS = {"export": _export, "verify": _verify, "diagnose": _diagnose, "repair": _repair, "inspect": _inspect,
         "export-streaming": lambda args: _streaming_cli().run(args),
         "quantize": lambda args: _quantize_cli().run(args)}


def run(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(argv[0] if argv and argv[0] in PARSERS else None).parse_args(argv)
    return VERBS[args.command](args)


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(argv)
    except (UsageError, FactoryError, HFError) as exc:
        print(f"onnx-compat: usage error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # one clear line for a pipeline's log, and the module at fault when known
        message = str(exc).strip().splitlines()
        print(f"onnx-compat: {type(exc).__name__}: {message[0] if message else ''}", file=sys.stderr)
        for line in message[1:]:
            if line.startswith("culprit "):
                print(line, file=sys.stderr)
        return 1


def command() -> None:
    """The ``onnx-compat`` console script: ``main`` with the process tuned as a command's (``command.py``)."""
    from onnx_compat.command import run_command
    sys.exit(run_command(main))


if __name__ == "__main__":
    command()
