"""``onnx-compat verify MODEL.onnx FACTORY``: ``verify()`` from the command line."""
from __future__ import annotations

import argparse
import json

from onnx_compat.cli_args import add_tolerances, load_examples, load_factory, write_report
from onnx_compat.cli_paths import Files
from onnx_compat.verbs.export import RUNTIME_HELP, declare_runtimes


def add_parser(sub) -> argparse.ArgumentParser:
    v = sub.add_parser("verify", help="check an ONNX file against a factory's eager model")
    v.add_argument("onnx")
    v.add_argument("factory", help="MODULE:FACTORY")
    add_tolerances(v)
    v.add_argument("--json", help="also write the results as JSON here")
    v.add_argument("--examples", help="real inputs to verify too: FILE.npz or FILE.pt")
    v.add_argument("--runtime", action="append", metavar="PYTHON|node:FOLDER|openvino", help=RUNTIME_HELP)
    return v


def files(args: argparse.Namespace) -> Files:
    """The model checked (and its weights file, when it has one), the examples; the results file."""
    found = declare_runtimes(Files().read_model(args.onnx, "onnx", "the model checked"), args.runtime)
    return found.read(args.examples, "--examples", "the examples").write(args.json, "--json", "the results")


def run(args: argparse.Namespace) -> int:
    from onnx_compat.graph import load
    from onnx_compat.pipeline.verification import verify
    examples = load_examples(args.examples)
    load(args.onnx)  # a damaged file is named now, not by ONNX Runtime's message
    model, inputs, outputs, factory_examples = load_factory(args.factory)
    results = verify(args.onnx, model, inputs, outputs, atol=args.atol, rtol=args.rtol,
                     examples=examples or factory_examples, runtimes=args.runtime or ())
    write_report(args.json, json.dumps([r.to_dict() for r in results], indent=2))
    for r in results:
        where = f" in {r.runtime}" if r.runtime else ""
        print(f"ok  {'example ' if r.example else ''}{r.sizes}{where}  "
              + ", ".join(f"{o.name} max abs err {o.max_abs_err:.2e}" for o in r.outputs))
    return 0
