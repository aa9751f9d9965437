"""``onnx-compat VERB ...``: one verb table, one usage error, one exit-code table.

Exit codes (``docs/cli.md``):

- 0: done;
- 1: the work failed (an export, a check, a file that cannot be read): one line ``onnx-compat: <ErrorClass>:
  <message>`` on stderr, then the ``culprit ...`` line when one was found; ``diagnose`` exits 1 when it names a
  culprit;
- 2: the command line is wrong (an unknown option or choice, ``KEY=VALUE`` without ``=``, a dim no input has, an
  output path that cannot be written, a FACTORY that does not import): one line ``onnx-compat: usage error: ...``,
  before any work starts;
- 130: interrupted (Ctrl-C): one line, no traceback; nothing half written is left.

A FACTORY is ``module:function``; the function returns
``{"model": nn.Module, "inputs": [TensorSpec...], "outputs": [TensorSpec...]}``
or the tuple ``(model, inputs, outputs)``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from onnx_compat.errors import ArgumentError, OutputPathError, UsageError

# verb -> the module that defines it: ``add_parser(subparsers)`` and ``run(args) -> exit code``. A verb's module is
# imported only when that verb runs (every one for ``--help``), so a command loads only its own layers. A verb of
# another layer is one line here and a module of its own with those two functions.
VERBS = {
    "export": "onnx_compat.verbs.export",
    "verify": "onnx_compat.verbs.verify",
    "diagnose": "onnx_compat.verbs.diagnose",
    "inspect": "onnx_compat.verbs.inspect",
    "repair": "onnx_compat.verbs.repair",
    "export-streaming": "onnx_compat.streaming.cli",
    "quantize": "onnx_compat.quantization.cli",
    "label-scorer": "onnx_compat.label_scorers.cli",
}

OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130


class Parser(argparse.ArgumentParser):
    """argparse's own complaints (an unknown choice, a missing argument) are the one usage error too."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def _parser(verb: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line; with ``verb``, that verb's options alone, so a command loads only its own layers."""
    p = Parser(prog="onnx-compat", description="Export PyTorch models to ONNX and prove them.")
    sub = p.add_subparsers(dest="command", required=True, metavar="VERB")
    for name, module in VERBS.items():
        if verb in (None, name):
            importlib.import_module(module).add_parser(sub)
    return p


def run(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` and run its verb; errors are raised (``main`` turns them into exit codes)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(argv[0] if argv and argv[0] in VERBS else None).parse_args(argv)
    return importlib.import_module(VERBS[args.command]).run(args)


def _say(text: str) -> None:
    print(f"onnx-compat: {text}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    """``onnx-compat``'s exit code for ``argv`` (the table in this module's docstring)."""
    try:
        return run(argv)
    except SystemExit as exc:  # --help and --version: argparse's own exit
        return exc.code if isinstance(exc.code, int) else OK
    except KeyboardInterrupt:
        _say("interrupted")
        return INTERRUPTED
    except (UsageError, ArgumentError, OutputPathError) as exc:  # what the library refused before any work
        _say(f"usage error: {_first_line(exc)}")
        return USAGE
    except Exception as exc:  # noqa: BLE001 - one clear line for a pipeline's log, and the module at fault
        lines = str(exc).strip().splitlines()
        _say(f"{type(exc).__name__}: {lines[0] if lines else ''}")
        for line in lines[1:]:
            if line.startswith("culprit "):
                print(line, file=sys.stderr)
        return FAILED


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def command() -> None:
    """The ``onnx-compat`` console script: ``main`` with the process tuned as a command's (``command.py``)."""
    from onnx_compat.command import run_command
    sys.exit(run_command(main))


if __name__ == "__main__":
    command()
