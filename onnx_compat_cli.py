"""The ``onnx-compat`` console script's first module, outside the package on purpose.

Importing ``onnx_compat`` imports torch, which takes a second or two; a Ctrl-C
in that time would otherwise end in Python's traceback from inside torch's
import, before ``onnx_compat.cli.main`` (which turns an interrupt into one
line and exit 130) is even defined. This module imports nothing heavy
itself, so it can give the same one line for an interrupt at any moment.
"""
import sys

INTERRUPTED = 130  # onnx_compat.cli's exit-code table


def command() -> None:
    """Import the CLI, then run it as a command (``onnx_compat.cli.command``)."""
    try:
        from onnx_compat.cli import command as run
    except KeyboardInterrupt:
        print("onnx-compat: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    run()


if __name__ == "__main__":
    command()
