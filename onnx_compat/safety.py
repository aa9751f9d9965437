"""Leave the user's model and files as they were, whatever happens.

The TorchScript exporter ends with ``model.train(root_flag)``, which sets every
submodule to the root's mode; an export that fails half-way must not leave a
partial ``.onnx`` behind.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable, Iterator, Optional

import onnx
import torch


@contextlib.contextmanager
def preserved(model: torch.nn.Module) -> Iterator[None]:
    """Run the block in eval mode; afterwards the model is as before.

    Restored: every module's training flag and plain attributes (its
    ``__dict__``: a forward that assigns ``self.window_size`` while tracing
    leaves a Tensor there; an attribute the block added is removed), every
    buffer (the same tensor object, with the same values), and every
    parameter's ``requires_grad``.
    """
    modules = list(model.modules())
    attributes = [dict(vars(m)) for m in modules]
    buffers = [{k: (b, None if b is None else b.detach().clone()) for k, b in m._buffers.items()} for m in modules]
    params = {name: (p, p.requires_grad) for name, p in model.named_parameters()}
    try:
        model.eval()
        yield
    finally:
        for module, before in zip(modules, attributes):
            _restore_attributes(module, before)
        for module, before in zip(modules, buffers):
            _restore_buffers(module, before)
        for name, p in model.named_parameters():
            if name in params and params[name][0] is p:
                p.requires_grad_(params[name][1])


def _restore_attributes(module: torch.nn.Module, before: dict) -> None:
    now = vars(module)
    for key in [k for k in now if k not in before]:
        del now[key]
    for key, value in before.items():
        if key not in now or now[key] is not value:
            now[key] = value


def _restore_buffers(module: torch.nn.Module, before: dict) -> None:
    for key in [k for k in module._buffers if k not in before]:
        del module._buffers[key]
    for key, (tensor, values) in before.items():
        module._buffers[key] = tensor
        if tensor is not None and not torch.equal(tensor.detach(), values):
            with torch.no_grad():
                tensor.copy_(values)


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


def check_room(path: str, needed: int) -> None:
    """A folder with less free space than the weights cannot hold the model: say so before exporting."""
    folder = os.path.dirname(path)
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if needed > free:
        raise ValueError(f"cannot write the ONNX model to {path!r}: its weights need {needed / 2**20:.1f} MiB "
                         f"and folder {folder!r} has {free / 2**20:.1f} MiB free")


def write_atomically(proto: onnx.ModelProto, path: str, before_rename: Optional[Callable[[], None]] = None) -> None:
    """Write ``proto`` to a temporary file beside ``path``, then rename it into place.

    ``before_rename``: a last step once the file is complete (moving its data file into place).
    A write that fails (no room, say) is one ``OSError`` naming the path; nothing is left."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        try:
            onnx.save(proto, tmp)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the ONNX model to {path!r}: {exc.strerror or exc}") from exc
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
