"""``onnx-compat VERB ...``: one verb table, one usage error, one exit-code table.

Exit codes: ``EXIT_CODES`` below, the one table every verb follows (``docs/cli.md`` says, verb by verb, what
falls in each row):

- 0: done;
- 1: the work failed (an export, a check, a model file that cannot be read): one line ``onnx-compat:
  <ErrorClass>: <message>`` on stderr, then the ``culprit ...`` line when one was found; ``diagnose`` exits 1
  when it names a culprit;
- 2: the command line is wrong, found before any work starts and with nothing written: an unknown option or
  choice, a bad value (``--beam 0``, ``--measure bogus``, ``KEY=VALUE`` without ``=``, a dim no input has), an
  input that does not exist (a FACTORY that does not import, ``hf:DIR`` that is no folder, the model to read),
  an output that cannot be written or that is another file of the same command (``--json`` equal to
  ``--out`` or to the model read: each verb's ``files(args)``, ``cli_paths.py``): one line ``onnx-compat:
  usage error: ...``;
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

from onnx_compat.cli_args import first_line
from onnx_compat.errors import ArgumentError, OutputPathError, UsageError

# verb -> the module that defines it: ``add_parser(subparsers)`` and ``run(args) -> exit code``. A verb's module is
# imported only when that verb runs (every one for ``--help``), so a command loads only its own layers. A verb of
# another layer is one line here and a module of its own with those two functions.
# verb -> its module, which also has ``files(args)``: every file the verb will read and write with these options,
# checked as one set (``cli_paths.Files``) before ``run``.
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

# The one exit-code table: an error's code is that of the first row it belongs to. Every verb's bad value is a
# ``UsageError`` (argparse's complaints, the verbs' checks, ``cli_paths``) or an argument the library refused
# before any work (``ArgumentError``, ``OutputPathError``); anything else is the work failing.
EXIT_CODES = (
    ((KeyboardInterrupt,), INTERRUPTED),
    ((UsageError, ArgumentError, OutputPathError), USAGE),
    ((Exception,), FAILED),
)


def exit_code(exc: BaseException) -> int:
    """``exc``'s row of ``EXIT_CODES``."""
    return next(code for kinds, code in EXIT_CODES if isinstance(exc, kinds))


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
    verb = importlib.import_module(VERBS[args.command])
    verb.files(args).check()  # every input there, every output writable and distinct: before any work
    return verb.run(args)


def _say(text: str) -> None:
    print(f"onnx-compat: {text}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    """``onnx-compat``'s exit code for ``argv`` (``EXIT_CODES``), and one line on stderr when it is not 0."""
    try:
        return run(argv)
    except SystemExit as exc:  # --help and --version: argparse's own exit
        return exc.code if isinstance(exc.code, int) else OK
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - one clear line for a pipeline's log
        code = exit_code(exc)
        _tell(exc, code)
        return code


def _tell(exc: BaseException, code: int) -> None:
    """The one line of ``exc`` for its exit code; a failure adds the ``culprit ...`` line when it has one."""
    if code == INTERRUPTED:
        _say("interrupted")
        return
    if code == USAGE:
        _say(f"usage error: {first_line(exc)}")
        return
    lines = str(exc).strip().splitlines()
    _say(f"{type(exc).__name__}: {lines[0] if lines else ''}")
    for line in lines[1:]:
        if line.startswith("culprit "):
            print(line, file=sys.stderr)


def command() -> None:
    """The ``onnx-compat`` console script: ``main`` with the process tuned as a command's (``command.py``)."""
    from onnx_compat.command import run_command
    sys.exit(run_command(main))


if __name__ == "__main__":
    command()
