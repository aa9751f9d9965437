"""``onnx-compat export-streaming FACTORY --out model.onnx``: the CLI face of ``export_streaming``.

FACTORY is ``module:function``; the function returns a dict with ``step``,
``inputs``, ``states`` and ``outputs`` and, optionally, ``full_forward``,
``init_states``, ``chunk``, ``shift``, ``right_context``, ``none_first``,
``module`` (the bundled ``onnx_compat.models.streaming_conformer:streaming_job``
and ``onnx_compat.models.lstm_encoder:streaming_job`` are examples).
``onnx_compat.cli``'s verb table names this module: ``add_parser(subparsers)``
and ``run(args)``, which returns the exit code.
"""
from __future__ import annotations

import argparse
import os

from onnx_compat.cli_args import (EXPORTERS, add_graph_options, add_tolerances, float_at_least, int_at_least, pairs,
                                  write_report)
from onnx_compat.cli_paths import Files
from onnx_compat.errors import FactoryError
from onnx_compat.factories import call_factory

REQUIRED = ("step", "inputs", "states", "outputs")
OPTIONAL = ("full_forward", "init_states", "chunk", "shift", "right_context", "none_first", "module", "time_axis")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("export-streaming", help="export a streaming step with its states, verify the stream")
    p.add_argument("factory", help="MODULE:FACTORY returning {step, inputs, states, outputs[, full_forward, ...]}")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--exporter", default="auto", choices=EXPORTERS)
    p.add_argument("--json", help="also write the report as JSON here")
    p.add_argument("--chunks", type=int_at_least(5, "a stream length"), default=6,
                   help="calls per verification stream (at least 5)")
    p.add_argument("--batch", type=int_at_least(1, "a batch size"), action="append",
                   help="a batch size to stream at (default: 1 and one more)")
    p.add_argument("--max-drift", type=float_at_least(0.0, above=True),
                   help="error when the stream drifts further from the full forward")
    add_graph_options(p)
    add_tolerances(p)
    return p


def load_job(spec: str) -> dict:
    job = call_factory(spec, FactoryError)
    if not isinstance(job, dict) or any(k not in job for k in REQUIRED):
        raise FactoryError(f"{spec} must return a dict with {list(REQUIRED)} (optional: {list(OPTIONAL)}), got "
                           + (f"keys {sorted(job)}" if isinstance(job, dict) else type(job).__name__))
    unknown = sorted(set(job) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise FactoryError(f"{spec} returned unknown keys {unknown}; known: {list(REQUIRED + OPTIONAL)}")
    return job


def files(args: argparse.Namespace) -> Files:
    """The step model, its weights file when they spill to one (``OUT.data``), and the report."""
    out = os.path.abspath(args.out)
    return Files().write(out, "--out", "the ONNX model").write(out + ".data", "--out", "the model's weights file "
                                                              "(OUT.data)").write(args.json, "--json", "the report")


def run(args: argparse.Namespace) -> int:
    from .api import export_streaming
    out = os.path.abspath(args.out)
    metadata = pairs(args.metadata, "--metadata")
    job = load_job(args.factory)
    report = export_streaming(job["step"], out, job["inputs"], job["states"], job["outputs"],
                              exporter=args.exporter, chunks=args.chunks, batches=args.batch,
                              max_drift=args.max_drift, metadata=metadata, opset=args.opset,
                              atol=args.atol, rtol=args.rtol, **{k: job[k] for k in OPTIONAL if k in job})
    write_report(args.json, report.to_json())
    print(report.summary())
    return 0
