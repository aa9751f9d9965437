"""Leave the user's model and files as they were, whatever happens.

The TorchScript exporter ends with ``model.train(root_flag)``, which sets every
submodule to the root's mode; an export that fails half-way must not leave a
partial ``.onnx`` behind.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator

import onnx
import torch


@contextlib.contextmanager
def preserved(model: torch.nn.Module) -> Iterator[None]:
    """Run the block in eval mode; afterwards every training flag and parameter is as before."""
    modules = list(model.modules())
    flags = [m.training for m in modules]
    params = {name: (p, p.requires_grad) for name, p in model.named_parameters()}
    try:
        model.eval()
        yield
    finally:
        for module, flag in zip(modules, flags):
            module.training = flag
        for name, p in model.named_parameters():
            if name in params and params[name][0] is p:
                p.requires_grad_(params[name][1])


def check_writable(path: str) -> str:
    """The absolute target path; a clear error now rather than after a long export."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise ValueError(f"cannot write the ONNX model to {path!r}: it is a directory")
    if not os.path.isdir(folder):
        raise ValueError(f"cannot write the ONNX model to {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"cannot write the ONNX model to {path!r}: folder {folder!r} is not writable")
    return path


def write_atomically(proto: onnx.ModelProto, path: str) -> None:
    """Write ``proto`` to a temporary file beside ``path``, then rename it into place."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        onnx.save(proto, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
