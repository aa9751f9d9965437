"""What several verbs read from their command line, checked before any work starts.

Below every CLI module (``cli.py``, ``verbs/``, ``streaming/cli.py``,
``quantization/cli.py``, ``label_scorers/cli.py``): they import this, never
``cli.py``, so a verb's layer never imports the command that dispatches it.
Every problem here is a ``UsageError`` naming the option (exit code 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from onnx_compat.errors import FactoryError, OnnxCompatError, UsageError
from onnx_compat.factories import call_factory

EXPORTERS = ("auto", "dynamo", "torchscript")


class LazyChoices:
    """argparse ``choices`` read on first use: the contracts' or recipes' names load their layer only when the
    option is given (or its error lists them), so ``export`` without ``--contract`` loads no consumer."""

    def __init__(self, names: Callable[[], Sequence[str]]) -> None:
        self._names, self._loaded = names, None

    def _all(self) -> Sequence[str]:
        if self._loaded is None:
            self._loaded = list(self._names())
        return self._loaded

    def __contains__(self, value) -> bool:
        return value in self._all()

    def __iter__(self):
        return iter(self._all())


class Progress:
    """Each stage and the time since the start, on stderr: an export of a large model takes minutes."""

    def __init__(self, stream) -> None:
        self.stream, self.start = stream, time.perf_counter()

    def __call__(self, stage: str) -> None:
        self.stream.write(f"onnx-compat [{time.perf_counter() - self.start:6.1f}s] {stage}\n")
        self.stream.flush()


def add_tolerances(parser) -> None:
    """``--atol``/``--rtol``, with ``export()``'s defaults, for every verb that compares with the eager model."""
    parser.add_argument("--atol", type=float_at_least(0.0), default=1e-4)
    parser.add_argument("--rtol", type=float_at_least(0.0), default=1e-3)


def add_graph_options(parser) -> None:
    """``--metadata``/``--opset``, for every verb that writes a graph it exports."""
    parser.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="extra metadata_props")
    parser.add_argument("--opset", type=opset)


def progress_for(args) -> Optional[Progress]:
    """Progress lines only for a person watching: stderr a terminal, and neither --quiet nor --json."""
    if getattr(args, "quiet", False) or getattr(args, "json", None) or not sys.stderr.isatty():
        return None
    return Progress(sys.stderr)


def pairs(items: Optional[Iterable[str]], option: str, cast: Callable[[str], object] = str) -> Dict[str, object]:
    """``KEY=VALUE`` options (``--size``, ``--metadata``, ``--threshold``) as a dict: the one parser of them."""
    out: Dict[str, object] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}", option=option)
        try:
            out[key] = cast(value)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"{option} {item!r}: {exc}", option=option) from None
        except ValueError:
            kind = getattr(cast, "__name__", "value")
            raise UsageError(f"{option} {item!r}: {value!r} is not a{'n' if kind[0] in 'aeiou' else ''} {kind}",
                             option=option) from None
    return out


def write_report(path: Optional[str], text: str) -> None:
    """``--json``: the report written whole (renamed into place), so a failed write leaves no half file."""
    if path is not None:
        from onnx_compat.pipeline.files import write_text_atomically
        write_text_atomically(os.path.abspath(path), text + "\n")


def int_at_least(low: int, what: str = "a count") -> Callable[[str], int]:
    """An argparse ``type``: an int of at least ``low``; anything else is the usage error naming the option
    (``--beam 0`` once reached the library and exited 1)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not {what}: at least {low}")
        return value
    return parse


def opset(text: str) -> int:
    """An argparse ``type``: an ONNX opset from 7 to the newest the installed onnx defines (``--opset 99`` once
    ran every exporter before failing, exit 1)."""
    value = int_at_least(7, "an ONNX opset")(text)
    import onnx
    newest = onnx.defs.onnx_opset_version()
    if value > newest:
        raise argparse.ArgumentTypeError(f"{value} is not an ONNX opset: onnx {onnx.__version__} defines up to "
                                         f"{newest}")
    return value


def float_at_least(low: float, above: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite float of at least ``low`` (above it with ``above``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > low if above else value >= low) or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {'above' if above else 'of at least'} "
                                             f"{low:g}")
        return value
    return parse


def checked_by(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type`` that asks the library's own check of a value (a measure's name, a target):
    what it refuses is the usage error, with the library's message, before any work."""
    def parse(text: str) -> str:
        try:
            check(text)
        except OnnxCompatError as exc:
            raise argparse.ArgumentTypeError(first_line(exc)) from None
        return text
    return parse


def usage_of(exc: OnnxCompatError, option: str) -> UsageError:
    """A library's refusal of a command-line value, found before any work, as the usage error naming
    ``option``."""
    return UsageError(f"{option}: {first_line(exc)}", option=option)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def load_factory(spec: str):
    """``(model, inputs, outputs, examples)`` from a FACTORY returning a dict or a 3-tuple."""
    job = call_factory(spec, FactoryError)
    if isinstance(job, dict):
        missing = [k for k in ("model", "inputs", "outputs") if k not in job]
        if missing:
            raise FactoryError(f"{spec} returned a dict without {missing}")
        return job["model"], job["inputs"], job["outputs"], job.get("examples")
    if isinstance(job, (tuple, list)) and len(job) == 3:
        return (*job, None)
    raise FactoryError(f"{spec} must return {{'model', 'inputs', 'outputs'}} or (model, inputs, outputs), "
                       f"got {type(job).__name__}")


def load_examples(path: Optional[str], option: str = "--examples"):
    """``--examples``: a ``.npz`` (one example, keys are ONNX input names) or a ``.pt`` (a dict or a list of dicts)."""
    if path is None:
        return None
    if not path.endswith((".npz", ".pt")):
        raise UsageError(f"{option} takes a .npz or .pt file, got {path!r}", option=option)
    import torch
    if path.endswith(".npz"):
        import numpy as np
        with np.load(path) as data:
            return [{k: torch.from_numpy(data[k]) for k in data.files}]
    loaded = torch.load(path, weights_only=True)
    return [loaded] if isinstance(loaded, dict) else loaded


def load_vocabulary(path: Optional[str], option: str = "--vocabulary") -> Optional[List[str]]:
    """A consumer's tokens, one per line."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh if line.strip()]
    except OSError as exc:
        raise UsageError(f"{option} {path!r}: {exc.strerror or exc}", option=option) from None


def sizes_for(items: Optional[Iterable[str]], inputs: Sequence, option: str = "--size") -> Dict[str, int]:
    """``--size DIM=N`` for the declared inputs: a dim no input has is a typo, named now."""
    sizes = pairs(items, option, int_at_least(1, "a size"))
    from onnx_compat.spec import TensorSpec
    specs = [inputs] if isinstance(inputs, TensorSpec) else list(inputs or ())
    known = sorted({d.name for s in specs if isinstance(s, TensorSpec) for d in s.dynamic_axes().values()})
    unknown = [name for name in sizes if name not in known]
    if unknown:
        raise UsageError(f"{option} {unknown[0]}=...: no input has a dim named {unknown[0]!r}; "
                         f"the dims are {known}", option=option)
    return sizes  # type: ignore[return-value]
