"""``onnx-compat quantize MODEL.onnx FACTORY [--recipe R|auto] [--target RUNTIME] --report REPORT.json [--out OUT]``.

``onnx_compat.cli``'s verb table names this module: ``add_parser(subparsers)``
adds the verb, ``run(args)`` runs it and returns the exit code (0: written; a
``QuantizationError`` is the CLI's one-line error and exit 1; a bad option a
usage error, exit 2, before any work).
"""
from __future__ import annotations

import argparse
import os

from onnx_compat.cli_args import (checked_by, int_at_least, load_examples, load_factory, pairs, usage_of,
                                  write_report)
from onnx_compat.cli_paths import Files
from onnx_compat.errors import UsageError

from . import auto
from .api import EXCLUDE_LIMIT, check_request, quantize
from .errors import QuantizationError
from .measures import DEFAULT, MEASURES, by_name
from .recipes import NAMES

MEASURE_HELP = (f"a measure for every float output, or for one ({', '.join(m.name for m in MEASURES)}, ctc:blank=K); "
                f"default {' and '.join(DEFAULT)} on every float output, and top1 too on an output of class scores "
                "(made by a (Log)Softmax, or named like logits, log_probs, scores)")


def _measure(text: str) -> None:
    """``NAME`` or ``OUTPUT=NAME``: the name is one the library knows (``measures.by_name``)."""
    by_name(text.partition("=")[2] if "=" in text else text)


def add_parser(subparsers) -> argparse.ArgumentParser:
    q = subparsers.add_parser("quantize", help="an int8/float16 version of a proven float model, verified, or nothing")
    q.add_argument("onnx", help="the float model (exported and verified)")
    q.add_argument("factory", help="MODULE:FACTORY (the eager model and its specs)")
    q.add_argument("--recipe", default="auto", choices=("auto", *NAMES),
                   help="default auto: the fastest recipe for --target that meets the thresholds and beats float")
    q.add_argument("--target", type=checked_by(auto.plan),
                   help="the runtime auto chooses for (default onnxruntime, CPU)")
    q.add_argument("--report", required=True, help="the float model's verification report (export --json)")
    q.add_argument("--out", help="the model to write (default: MODEL.<recipe>.onnx beside MODEL.onnx)")
    q.add_argument("--measure", action="append", metavar="NAME|OUTPUT=NAME", type=checked_by(_measure),
                   help=MEASURE_HELP)
    q.add_argument("--threshold", action="append", metavar="MEASURE=V|OUTPUT/MEASURE=V", help="a lower bound")
    q.add_argument("--examples", help="calibration inputs: FILE.npz or FILE.pt (default: generated)")
    q.add_argument("--exclude-limit", type=int_at_least(0, "a node count"), default=EXCLUDE_LIMIT,
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


def files(args: argparse.Namespace) -> Files:
    """The float model (never written to), its report and the examples; the quantized model (``--out``, or by
    default ``MODEL.<recipe>.onnx`` for each recipe ``auto`` may choose) and the report."""
    found = Files().read_model(args.onnx, "onnx", "the float model").read(args.report, "--report", "the float "
                                                                           "model's report")
    found.read(args.examples, "--examples", "the examples")
    for out in _outputs(args):
        found.write(out, "--out", "the quantized model")
    return found.write(args.json, "--json", "the quantization report")


def _outputs(args: argparse.Namespace) -> list:
    if args.out is not None:
        return [args.out]
    names = auto.plan(args.target).candidates if args.recipe == auto.AUTO else (args.recipe,)
    stem, ext = os.path.splitext(os.path.abspath(args.onnx))
    return [f"{stem}.{name}{ext or '.onnx'}" for name in names]


def _checked(args: argparse.Namespace, inputs, outputs, examples, graph):
    """The recipe, measures, thresholds and examples as the library checks them, before any work: what it
    refuses is a bad value on the command line (exit 2), naming the option."""
    measures, thresholds = _measures(args.measure), pairs(args.threshold, "--threshold", float)
    # one option added at a time, so a refusal names the option that brought it
    for option, given in (("FACTORY", {}), ("--measure", dict(measures=measures)),
                          ("--threshold", dict(measures=measures, thresholds=thresholds)),
                          ("--examples", dict(measures=measures, thresholds=thresholds, examples=examples))):
        try:
            check_request(args.recipe, inputs, outputs, target=args.target, graph=graph, **given)
        except QuantizationError as exc:
            raise usage_of(exc, option) from None
    return measures, thresholds


def run(args: argparse.Namespace) -> int:
    from onnx_compat.graph import load
    examples = load_examples(args.examples)
    proto = load(args.onnx)  # a damaged model is named before the factory runs
    model, inputs, outputs, factory_examples = load_factory(args.factory)
    measures, thresholds = _checked(args, inputs, outputs, examples or factory_examples, proto.graph)
    report = quantize(args.onnx, model, inputs, outputs, recipe=args.recipe, target=args.target, out=args.out,
                      measures=measures, thresholds=thresholds, examples=examples or factory_examples,
                      report=args.report, exclude_limit=args.exclude_limit)
    write_report(args.json, report.to_json())
    print(report.summary())
    return 0
