"""``onnx-compat quantize MODEL.onnx FACTORY --recipe R --report REPORT.json [--out OUT]``.

``add_parser(subparsers)`` adds the verb to the CLI's parser; ``run(args)``
runs it and returns the exit code (0: written; a ``QuantizationError`` is
raised for the CLI's one-line error and exit 1).
"""
from __future__ import annotations

import argparse

from ._deps import load_examples, load_factory
from .api import EXCLUDE_LIMIT, quantize
from .errors import QuantizationError
from .measures import MEASURES
from .recipes import NAMES


def add_parser(subparsers) -> argparse.ArgumentParser:
    q = subparsers.add_parser("quantize", help="an int8/float16 version of a proven float model, verified, or nothing")
    q.add_argument("onnx", help="the float model (exported and verified)")
    q.add_argument("factory", help="MODULE:FACTORY (the eager model and its specs)")
    q.add_argument("--recipe", required=True, choices=NAMES)
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
            raise QuantizationError(f"--measure {item!r}: use NAME for every output or OUTPUT=NAME, not both",
                                    measure=item)
        per_output.setdefault(output, []).append(name)
    return per_output


def _thresholds(items):
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            raise QuantizationError(f"--threshold {item!r}: expected MEASURE=NUMBER", measure=key or None) from None
        if not sep or not key:
            raise QuantizationError(f"--threshold {item!r}: expected MEASURE=NUMBER", measure=key or None)
    return out


def run(args: argparse.Namespace) -> int:
    model, inputs, outputs, examples = load_factory(args.factory)
    report = quantize(args.onnx, model, inputs, outputs, recipe=args.recipe, out=args.out,
                      measures=_measures(args.measure), thresholds=_thresholds(args.threshold),
                      examples=load_examples(args.examples) or examples, report=args.report,
                      exclude_limit=args.exclude_limit)
    if args.json:
        report.to_json(args.json)
    print(report.summary())
    return 0
