"""``onnx-compat label-scorer``: the CLI face of ``export_label_scorer`` and ``combine_label_scorers``.

``onnx-compat label-scorer FACTORY --out FOLDER`` writes one scorer; FACTORY is ``module:function``
returning ``export_label_scorer``'s keyword arguments (``kind``, ``encoder``, ``features``, ``score``,
``vocabulary``, ...). ``--manager`` picks RASR's state manager of a ``kind="state-managed"`` job,
``--release`` the RASR release (``transducer-pr`` for a transducer, ``full-context-pr`` for
``kind="full-context"``). ``onnx-compat label-scorer --combine FACTORY=SCALE --combine FACTORY=SCALE ...
--out FOLDER`` writes RASR's ``combine`` of the factories' scorers, each scaled, into a new folder, and
proves the combined search (``combine.py``). The bundled factories:
``onnx_compat.models.aed:label_scorer_job`` (``stateful-onnx``),
``onnx_compat.models.aed:ctc_label_scorer_job`` (``no-context-onnx``),
``onnx_compat.models.transducer:label_scorer_job`` (``stateful-transducer-onnx``),
``onnx_compat.models.transducer:fixed_context_label_scorer_job`` (``fixed-context-onnx``),
``onnx_compat.models.i6_aed:label_scorer_job`` (``stateful-onnx``, a frames-sized state) and
``onnx_compat.models.label_scorer_jobs``' (``state-managed-onnx``, ``full-context-onnx``, the pieces of a
combination). ``onnx_compat.cli`` calls ``add_parser(subparsers)``, ``files(args)`` and ``run(args)``.
"""
from __future__ import annotations

import argparse
import inspect
import os
from typing import List, Optional, Tuple

from onnx_compat.cli_args import EXPORTERS, float_at_least, int_at_least, progress_for, usage_of
from onnx_compat.cli_paths import Files
from onnx_compat.errors import FactoryError, UsageError
from onnx_compat.factories import call_factory

VERB = "label-scorer"
RELEASES = ("master", "transducer-pr", "full-context-pr")  # rasr_specs.RELEASES and full_context.RELEASE
MANAGERS = ("transformer", "lstm")  # managers.MANAGERS (not imported: that loads torch for --help)
# what each option is for: an option given for another kind is a usage error, before any export
KIND_OF_OPTION = {"--manager": ("state-managed",)}
# the releases each kind is written for (export_label_scorer refuses the others); the rest: master, transducer-pr
RELEASES_OF_KIND = {"state-managed": ("master",), "full-context": ("full-context-pr",),
                    "transducer": ("transducer-pr",)}
OTHER_RELEASES = ("master", "transducer-pr")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(VERB, help="export a RASR label scorer folder (graphs + config), proven by decoding")
    p.add_argument("factory", nargs="?", help="MODULE:FACTORY returning export_label_scorer's keyword arguments")
    p.add_argument("--combine", action="append", type=combined_entry, metavar="FACTORY=SCALE",
                   help="a scorer of a combination and its scale (repeat: one AED, optional CTC heads as ctc-prefix "
                        "and LMs); instead of FACTORY")
    p.add_argument("--out", required=True, help="the folder to write (graphs, label-scorer.config, report.json)")
    p.add_argument("--exporter", default="auto", choices=EXPORTERS)
    p.add_argument("--release", choices=RELEASES, help="the RASR release (default: the job's)")
    p.add_argument("--manager", choices=MANAGERS, help="RASR's state manager of a kind='state-managed' job")
    p.add_argument("--beam", type=int_at_least(1, "a beam width"), help="the proof's beam width (default 4)")
    p.add_argument("--utterances", help="feature lengths the proof decodes, comma-separated")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (shown on a terminal)")
    return p


def combined_entry(text: str) -> Tuple[str, float]:
    """An argparse ``type``: ``FACTORY=SCALE``, the scale a positive finite number (RASR's ``scale``)."""
    factory, sep, scale = text.rpartition("=")
    if not sep or not factory:
        raise argparse.ArgumentTypeError(f"takes FACTORY=SCALE, got {text!r}")
    return factory, float_at_least(0.0, above=True)(scale)


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


def _form(args: argparse.Namespace) -> str:
    """``"one"`` (FACTORY) or ``"combine"`` (--combine ...); both, neither, or a combination of one scorer and
    the options a combination does not take are usage errors."""
    if (args.factory is None) == (not args.combine):
        raise UsageError("label-scorer takes FACTORY (one scorer) or --combine FACTORY=SCALE at least twice (a "
                         "combination), not " + ("both" if args.factory else "neither"), option="--combine")
    if args.factory is not None:
        return "one"
    if len(args.combine) < 2:
        raise UsageError("--combine takes at least two scorers (one is the FACTORY form)", option="--combine")
    given = [o for o, v in (("--manager", args.manager), ("--release", args.release)) if v is not None]
    if given:
        raise UsageError(f"{given[0]} is for one scorer: in a combination each FACTORY says its own", option=given[0])
    return "combine"


def files(args: argparse.Namespace) -> Files:
    """The folder: its graphs, ``label-scorer.config`` and ``report.json`` go in it (a combination's into a
    new folder, ``scorer-<i>/`` each)."""
    if _form(args) == "combine" and os.path.exists(args.out):
        raise UsageError(f"--out: {os.path.abspath(args.out)!r} exists: a combination is written into a new folder",
                         option="--out")
    return Files().write(args.out, "--out", "the label scorer folder", folder=True)


def check_kind_options(job: dict, release: Optional[str], manager: Optional[str], spec: str) -> None:
    """``--manager`` and ``--release`` against the factory's kind, before any export: a manager for a kind
    without one, a release the kind is not in."""
    kind = job.get("kind")
    if manager is not None and kind not in KIND_OF_OPTION["--manager"]:
        raise UsageError(f"--manager {manager}: {spec} returns kind={kind!r}; --manager is for "
                         "kind='state-managed'", option="--manager")
    allowed = RELEASES_OF_KIND.get(kind, OTHER_RELEASES)
    chosen = release or job.get("release", "master")
    if chosen in allowed:
        return
    if len(allowed) == 1:
        raise UsageError(f"{spec} returns kind={kind!r}, written for RASR's {allowed[0]} only: pass --release "
                         f"{allowed[0]}", option="--release")
    raise UsageError(f"--release {chosen}: {spec} returns kind={kind!r}, written for {' or '.join(allowed)}",
                     option="--release")


def run(args: argparse.Namespace) -> int:
    if _form(args) == "combine":
        return _run_combination(args)
    from .api import export_label_scorer
    utterances = _utterances(args.utterances)
    job = load_job(args.factory)
    check_kind_options(job, args.release, args.manager, args.factory)
    job["exporter"] = args.exporter
    for key, value in (("release", args.release), ("manager", args.manager), ("beam", args.beam),
                       ("utterances", utterances)):
        if value is not None:
            job[key] = value
    report = export_label_scorer(args.out, **job, progress=progress_for(args))
    _print_one(report)
    return 0


def _print_one(report) -> None:
    manager = getattr(report, "manager", "")
    print(f"label scorer  {report.rasr_type}{f' ({manager} manager)' if manager else ''} for {report.release}, "
          f"written to {report.folder}")
    print("files         " + ", ".join(sorted(report.files)))
    print(f"RASR loader   ok ({len(report.loader)} graphs: validator, state rules, assumptions)")
    print(f"decodes       {len(report.decodes)} equal to PyTorch's; {report.rows_checked} batched rows equal "
          "their context scored alone")
    _print_decodes(report.decodes)
    for note in report.notes:
        print(f"note          {note}")
    for path in report.removed:
        print(f"removed       {path} (an earlier export's file not written again)")
    print(f"config        {report.files['label-scorer.config']}")


def _print_decodes(decodes: List[dict]) -> None:
    for d in decodes:  # an LM's decodes have no features
        where = f"{d['feature_frames']:>4} frames" if "feature_frames" in d else "  no encoder"
        print(f"  {where}  {d['search']:<55} {d['labels'][:12]}"
              f"{' ...' if len(d['labels']) > 12 else ''}")


def _run_combination(args: argparse.Namespace) -> int:
    """``--combine``: every factory loaded and checked before the first export, then ``combine_label_scorers``."""
    from .combine import check_scorers, combine_label_scorers
    from .errors import LabelScorerError
    utterances = _utterances(args.utterances)
    scorers = []
    for spec, scale in args.combine:
        job = load_job(spec)
        job["exporter"] = args.exporter
        scorers.append((job, scale))
    try:
        check_scorers(scorers)
    except LabelScorerError as exc:  # two AEDs, an unscalable kind: the command line's combination is wrong
        raise usage_of(exc, "--combine") from None
    extra = {k: v for k, v in (("beam", args.beam), ("utterances", utterances)) if v is not None}
    report = combine_label_scorers(args.out, scorers, **extra, progress=progress_for(args))
    print(f"combination   {len(report.scorers)} label scorers (type = combine), written to {report.folder}")
    for s in report.scorers:
        print(f"  {s['scorer']}  {s['role']:<10} {s['kind']:<14} scale {s['scale']:g}  {s['folder']}")
    print(f"decodes       {len(report.decodes)} combined searches equal to PyTorch's (costs: sums of scaled costs)")
    _print_decodes(report.decodes)
    for note in report.notes:
        print(f"note          {note}")
    print(f"config        {os.path.join(report.folder, 'label-scorer.config')}")
    return 0
