"""``onnx-compat quantize MODEL.onnx FACTORY [--recipe R|auto] [--target RUNTIME] --report REPORT.json [--out OUT]``.

``onnx_compat.cli``'s verb table names this module: ``add_parser(subparsers)``
adds the verb, ``run(args)`` runs it and returns the exit code (0: written; a
``QuantizationError`` is the CLI's one-line error and exit 1; a bad option a
usage error, exit 2, before any work).
"""
from __future__ import annotations

import argparse

from onnx_compat.cli_args import load_examples, load_factory, pairs, readable, writable
from onnx_compat.errors import UsageError

from .api import EXCLUDE_LIMIT, quantize
from .measures import MEASURES
from .recipes import NAMES


def add_parser(subparsers) -> argparse.ArgumentParser:
    q = subparsers.add_parser("quantize", help="an int8/float16 version of a proven float model, verified, or nothing")
    q.add_argument("onnx", help="the float model (exported and verified)")
    q.add_argument("factory", help="MODULE:FACTORY (the eager model and its specs)")
    q.add_argument("--recipe", default="auto", choices=("auto", *NAMES),
                   help="default auto: the fastest recipe for --target that meets the thresholds and beats float")
    q.add_argument("--target", help="the runtime auto chooses for (default onnxruntime, CPU)")
    q.add_argument("--report", required=True, help="the float model's verification report (export --json)")
    q.add_argument("--out", help="the model to write (default: MODEL.<recipe>.onnx beside MODEL.onnx)")
    q.add_argument("--measure", action="append", metavar="NAME|OUTPUT=NAME",
                   help=f"a measure for every float output, or for one ({', '.join(m.name for m in MEASURES)}, "
                        "ctc:blank=K); default snr and cosine")
    q.add_argument("--threshold", action="append", metavar="MEASURE=V|OUTPUT/MEASURE=V", help="a lower bound")
    q.add_argument("--examples", help="calibration inputs: FILE.npz or FILE.pt (default: generated)")
    q.add_argument("--exclude-limit", type=int, default=EXCLUDE_LIMIT,
                   help="most nodes automatic exclusion may keep in float")
    q.add_argument("--json", help="also write the quantization report as JSON here")
    return q


def _measures(items):
    if not items:
        return None
    if not any("=" in item for item in items):
        return list(items)
    per_output: dict = {}
    for item in items:
        output, sep, name = item.partition("=")
        if not sep:
            raise UsageError(f"--measure {item!r}: use NAME for every output or OUTPUT=NAME, not both",
                             option="--measure")
        per_output.setdefault(output, []).append(name)
    return per_output


def run(args: argparse.Namespace) -> int:
    from onnx_compat.graph import load
    out = writable(args.out or args.onnx, "--out", "the quantized model")  # default: beside MODEL.onnx
    report_path = writable(args.json, "--json", "the report")
    readable(args.report, "--report")
    measures, thresholds = _measures(args.measure), pairs(args.threshold, "--threshold", float)
    examples = load_examples(args.examples)
    load(args.onnx)  # a missing or damaged model is named before the factory runs
    model, inputs, outputs, factory_examples = load_factory(args.factory)
    report = quantize(args.onnx, model, inputs, outputs, recipe=args.recipe, target=args.target, out=args.out and out,
                      measures=measures, thresholds=thresholds, examples=examples or factory_examples,
                      report=args.report, exclude_limit=args.exclude_limit)
    if report_path:
        report.to_json(report_path)
    print(report.summary())
    return 0
