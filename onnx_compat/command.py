"""What a command of ours does with its own process, which a library call must not do to its caller's.

Measured on this project's machine (``docs/huggingface.md``): importing torch
and transformers creates some millions of objects, and Python's cyclic
garbage collector walks them again and again, while the command runs and
once more when the interpreter exits (0.5 s after ``import torch`` alone, 0.9
s with transformers). A command keeps nearly all of those objects to its end,
so it collects a tenth as often, and freezes them once it is done, which
leaves the exit nothing to walk. Its files are closed by then, and ``atexit``
handlers (logging's flush among them) still run.
"""
from __future__ import annotations

import gc
import sys
from typing import Callable, List, Optional

YOUNG_EVERY = 10  # collect the youngest generation this many times less often (mypy's command does likewise)


def run_command(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]] = None) -> int:
    """``main(argv)``'s exit code, run the way a command's process may be."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0] * YOUNG_EVERY, *thresholds[1:])
    try:
        code = main(argv)
    finally:
        gc.set_threshold(*thresholds)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    gc.freeze()
    return code
