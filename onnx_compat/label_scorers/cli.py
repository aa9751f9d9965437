"""``onnx-compat label-scorer FACTORY --out FOLDER``: the CLI face of ``export_label_scorer``.

FACTORY is ``module:function``; the function returns ``export_label_scorer``'s
keyword arguments (``kind``, ``encoder``, ``features``, ``encoder_dim``,
``score``, ``vocabulary``, ...). The bundled examples:
``onnx_compat.models.aed:label_scorer_job`` (``stateful-onnx``),
``onnx_compat.models.aed:ctc_label_scorer_job`` (``no-context-onnx``),
``onnx_compat.models.transducer:label_scorer_job`` (``stateful-transducer-onnx``),
``onnx_compat.models.transducer:fixed_context_label_scorer_job``
(``fixed-context-onnx``). ``onnx_compat.cli`` calls ``add_parser(subparsers)``
and, for the verb ``label-scorer``, ``run(args)``, which returns the exit code.
"""
from __future__ import annotations

import argparse
import inspect

from onnx_compat.cli_args import EXPORTERS, int_at_least, progress_for
from onnx_compat.cli_paths import Files
from onnx_compat.errors import FactoryError, UsageError
from onnx_compat.factories import call_factory

VERB = "label-scorer"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(VERB, help="export a RASR label scorer folder (graphs + config), proven by decoding")
    p.add_argument("factory", help="MODULE:FACTORY returning export_label_scorer's keyword arguments")
    p.add_argument("--out", required=True, help="the folder to write (graphs, label-scorer.config, report.json)")
    p.add_argument("--exporter", default="auto", choices=EXPORTERS)
    p.add_argument("--release", choices=["master", "transducer-pr"], help="the RASR release (default: the job's)")
    p.add_argument("--beam", type=int_at_least(1, "a beam width"), help="the proof's beam width (default 4)")
    p.add_argument("--utterances", help="feature lengths the proof decodes, comma-separated")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (shown on a terminal)")
    return p


def load_job(spec: str) -> dict:
    from .api import export_label_scorer
    job = call_factory(spec, FactoryError)
    known = set(inspect.signature(export_label_scorer).parameters) - {"folder", "progress"}  # the command's
    if not isinstance(job, dict):
        raise FactoryError(f"{spec} must return export_label_scorer's keyword arguments as a dict, got "
                           f"{type(job).__name__}")
    unknown = sorted(set(job) - known)
    if unknown:
        raise FactoryError(f"{spec} returned keys export_label_scorer does not take: {unknown}")
    return job


def _utterances(text):
    if text is None:
        return None
    try:
        lengths = [int(n) for n in text.split(",")]
    except ValueError:
        lengths = [0]
    if min(lengths) < 1:
        raise UsageError(f"--utterances takes comma-separated feature frame counts of at least 1, got {text!r}",
                         option="--utterances")
    return lengths


def files(args: argparse.Namespace) -> Files:
    """The folder: its graphs, ``label-scorer.config`` and ``report.json`` go in it."""
    return Files().write(args.out, "--out", "the label scorer folder", folder=True)


def run(args: argparse.Namespace) -> int:
    from .api import export_label_scorer
    utterances = _utterances(args.utterances)
    job = load_job(args.factory)
    job["exporter"] = args.exporter
    for key, value in (("release", args.release), ("beam", args.beam), ("utterances", utterances)):
        if value is not None:
            job[key] = value
    report = export_label_scorer(args.out, **job, progress=progress_for(args))
    print(f"label scorer  {report.rasr_type} for {report.release}, written to {report.folder}")
    print("files         " + ", ".join(sorted(report.files)))
    print(f"RASR loader   ok ({len(report.loader)} graphs: validator, state rules, assumptions)")
    print(f"decodes       {len(report.decodes)} equal to PyTorch's; {report.rows_checked} batched rows equal "
          "their context scored alone")
    for d in report.decodes:
        print(f"  {d['feature_frames']:>4} frames  {d['search']:<55} {d['labels'][:12]}"
              f"{' ...' if len(d['labels']) > 12 else ''}")
    print(f"config        {report.files['label-scorer.config']}")
    return 0
