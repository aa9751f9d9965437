"""``onnx-compat export hf:DIR --task TASK --out model.onnx``: the command line of ``export_pretrained``.

``add_arguments`` adds ``--task`` (and ``--no-files``) to an ``export``
parser and ``export_from_args`` runs an export whose source is ``hf:DIR``, so
the main command line can hand ``hf:`` sources over. ``main(argv)`` is the
same as a command of its own (``python -m onnx_compat.huggingface.cli hf:DIR
...``): exit 0 on success, 2 for bad input (an ``HFError``: one line naming
it), 1 for a failed export.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .errors import HFError  # noqa: F401 - the standalone main's exit code 2
from .families import COVERED, TASK_NAMES
from .job import export_pretrained

PREFIX = "hf:"


def is_hf_source(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options an ``hf:DIR`` source takes beyond those of ``export``."""
    parser.add_argument("--task", choices=TASK_NAMES,
                        help="hf:DIR only: what to export (default: the task of the checkpoint's architecture)")
    parser.add_argument("--no-files", action="store_true",
                        help="hf:DIR only: do not copy config, preprocessor and tokenizer files beside the model")


def build_parser() -> argparse.ArgumentParser:
    """The main command line's ``export`` verb (one definition of its options): ``hf:DIR`` and the rest."""
    from onnx_compat.cli import export_parser  # the main CLI imports this module: import on use
    parser = export_parser()
    parser.description = ("Export a transformers checkpoint folder (hf:DIR) with lengths, verify it, write it and "
                          f"its runtime files. Covered model types: {', '.join(COVERED)}.")
    return parser


def _pairs(items: Optional[List[str]], option: str, cast=str) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} takes KEY=VALUE, got {item!r}")
        out[key] = cast(value)
    return out


def export_from_args(args: argparse.Namespace, examples=None, **extra):
    """Export ``args.factory`` (``hf:DIR``) as the ``export`` options say; the ``Report``.

    Options the parser at hand does not define keep ``export``'s defaults; ``extra`` are more
    ``export`` arguments (the main CLI's progress, contract, vocabulary and quantize).
    """
    folder = args.factory[len(PREFIX):] if is_hf_source(args.factory) else args.factory
    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    kwargs = dict(exporter=get("exporter", "auto"), sizes=_pairs(get("size"), "--size", int) or None,
                  metadata=_pairs(get("metadata"), "--metadata"), opset=get("opset"), atol=get("atol", 1e-4),
                  rtol=get("rtol", 1e-3), verify=not get("no_verify", False), strict=get("strict", False),
                  rasr=get("rasr", False), target=get("target"), examples=examples)
    for name, key in (("runtime", "runtimes"), ("external_data", "external_data")):
        if get(name) is not None:
            kwargs[key] = get(name)
    kwargs.update({k: v for k, v in extra.items() if v is not None})
    report = export_pretrained(folder, args.out, get("task"), copy_files=not get("no_files", False), **kwargs)
    if get("json"):
        report.to_json(args.json)
    return report


def run(argv: Optional[List[str]] = None):
    """Parse ``argv`` and export; the ``Report`` (errors raised)."""
    return export_from_args(build_parser().parse_args(argv))


def main(argv: Optional[List[str]] = None) -> int:
    try:
        report = run(argv)
    except HFError as exc:
        print(f"onnx-compat: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for a pipeline's log
        lines = str(exc).strip().splitlines()
        print(f"onnx-compat: {type(exc).__name__}: {lines[0] if lines else ''}", file=sys.stderr)
        return 1
    print(report.summary())
    print("files       " + (", ".join(report.files) or "none"))
    return 0


def command() -> None:
    """``python -m onnx_compat.huggingface.cli``: ``main`` with the process tuned as a command's (``command.py``)."""
    from onnx_compat.command import run_command
    sys.exit(run_command(main))


if __name__ == "__main__":
    command()
