"""``onnx-compat diagnose FACTORY``: ``diagnose()`` from the command line; exit 1 when it names a culprit."""
from __future__ import annotations

import argparse

from onnx_compat.cli_args import add_tolerances, load_examples, load_factory, sizes_for
from onnx_compat.cli_paths import Files


def add_parser(sub) -> argparse.ArgumentParser:
    d = sub.add_parser("diagnose", help="name the module at fault: a failed export, other numbers, a baked dim")
    d.add_argument("factory", help="MODULE:FACTORY")
    d.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    d.add_argument("--size", action="append", metavar="DIM=N", help="example size of a named dim")
    d.add_argument("--examples", help="real inputs: FILE.npz or FILE.pt")
    add_tolerances(d)
    return d


def files(args: argparse.Namespace) -> Files:
    """``diagnose`` writes nothing; it reads the examples."""
    return Files().read(args.examples, "--examples", "the examples")


def run(args: argparse.Namespace) -> int:
    from onnx_compat.diagnosis import diagnose
    examples = load_examples(args.examples)
    model, inputs, outputs, factory_examples = load_factory(args.factory)
    found = diagnose(model, inputs, outputs, exporter=args.exporter, sizes=sizes_for(args.size, inputs),
                     examples=examples or factory_examples, atol=args.atol, rtol=args.rtol)
    print(found.summary())
    return 1 if found.findings else 0
