"""``onnx-compat export hf:DIR --task TASK --out model.onnx``: what the ``export`` verb adds for checkpoint folders.

``add_arguments`` adds ``--task`` (and ``--no-files``) to the ``export`` verb's
parser and ``export_hf`` runs an export whose source is ``hf:DIR``; the verb
(``onnx_compat/verbs/export.py``) checks every option first, as for a
factory, and prints the report. This layer has no command of its own (it had
one, with other exit codes): ``onnx-compat export hf:DIR ...``.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional

from .families import TASK_NAMES

PREFIX = "hf:"


def is_hf_source(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options an ``hf:DIR`` source takes beyond those of ``export``."""
    parser.add_argument("--task", choices=TASK_NAMES,
                        help="hf:DIR only: what to export (default: the task of the checkpoint's architecture)")
    parser.add_argument("--no-files", action="store_true",
                        help="hf:DIR only: do not copy config, preprocessor and tokenizer files beside the model")


def export_hf(source: str, out: str, task: Optional[str], *, copy_files: bool = True, **export_kwargs):
    """``export_pretrained`` of the folder ``source`` names (``hf:DIR``); the ``Report``."""
    from .job import export_pretrained
    folder = source[len(PREFIX):] if is_hf_source(source) else source
    return export_pretrained(folder, out, task, copy_files=copy_files, **export_kwargs)


def declare_files(source: str, out: str, copy_files: bool, files) -> None:
    """What an ``hf:DIR`` export reads and writes beyond the model (``cli_paths.Files``): the checkpoint
    folder, and each runtime file it holds, copied beside ``out`` (unless it is already there)."""
    from .files import runtime_files
    folder = source[len(PREFIX):]
    files.read(folder, "hf:DIR", "the checkpoint folder", folder=True)
    if not os.path.isdir(folder):
        return  # files.check() names it
    beside = os.path.dirname(os.path.abspath(out))
    for path in runtime_files(folder):
        name = os.path.basename(path)
        files.read(path, "hf:DIR", f"the checkpoint's {name}")
        copy = os.path.join(beside, name)
        if copy_files and not (os.path.exists(copy) and os.path.samefile(copy, path)):
            files.write(copy, "--out", f"the checkpoint's {name} copied beside the model")
