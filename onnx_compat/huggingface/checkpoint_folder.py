"""What both halves of the transformers support read first from a checkpoint folder, and how they load it.

``job.py`` (the covered families) and ``whisper.py`` (the sherpa-onnx/whisper contract) both read
``config.json``'s model type, load through transformers with its load report off, and name a failure by
the first line of what transformers raised. They live here, below both: ``job.py`` hands Whisper folders to
``whisper.py``, so ``whisper.py`` reading them from ``job.py`` made the two import each other.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Optional

from .errors import ConfigError


def read_model_type(folder: str, task: Optional[str]) -> str:
    path = os.path.join(folder, "config.json")
    fields = dict(folder=folder, task=task, model_type=None)
    if not os.path.isdir(folder):
        raise ConfigError(f"{folder} is not a folder", **fields)
    if not os.path.isfile(path):
        raise ConfigError(f"{folder} has no config.json: not a transformers checkpoint folder", **fields)
    try:
        with open(path, encoding="utf-8") as fh:
            model_type = json.load(fh).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{path} does not read as a JSON object: {exc}", **fields) from exc
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"{path} has no model_type", **fields)
    return model_type


@contextmanager
def quiet(transformers):
    """transformers' load report (a table repeating what our error says) and its weight-loading progress bars
    (carriage-return lines that fill a log when stderr is a pipe) off while we load; both put back after."""
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    bars = getattr(logging, "is_progress_bar_enabled", lambda: False)()
    logging.set_verbosity_error()
    if bars:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
