"""Files the pipeline writes: checked before the export, written whole or not at all.

A failed export must leave no partial ``.onnx`` behind and a previous model
intact, so every write goes to a temporary file beside the target that is
renamed into place last.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from typing import Callable, Optional

import onnx

from onnx_compat.errors import OutputPathError, WriteError


def check_writable(path: str, what: str = "the ONNX model") -> str:
    """The absolute target path; a clear error now rather than after a long export. ``what``: the file's role,
    for the message (the report, the float model)."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise OutputPathError(f"cannot write {what} to {path!r}: it is a directory", path=path)
    if not os.path.isdir(folder):
        raise OutputPathError(f"cannot write {what} to {path!r}: folder {folder!r} does not exist", path=path)
    why = refuses_a_file(folder)
    if why:
        raise OutputPathError(f"cannot write {what} to {path!r}: folder {folder!r} is not writable ({why})", path=path)
    return path


def refuses_a_file(folder: str) -> Optional[str]:
    """Why ``folder`` does not take a new file, or None. A file made there and removed at once is the one test
    that ``/proc``, a read-only mount or a folder without permission gives: ``os.access`` says yes to root
    everywhere, and ``/proc/a.json`` once passed the check and failed after the export."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".onnx-compat-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(probe)
    return None


def check_room(path: str, needed: int) -> None:
    """A folder with less free space than the weights cannot hold the model: say so before exporting."""
    folder = os.path.dirname(path)
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if needed > free:
        raise OutputPathError(f"cannot write the ONNX model to {path!r}: its weights need {needed / 2**20:.1f} MiB "
                         f"and folder {folder!r} has {free / 2**20:.1f} MiB free", path=path)


def content_hash(path: str) -> str:
    """``sha256:<hex>`` of the file's bytes: what a report records of the model it proved, so a report
    can be matched to a model file later (``quantize``), whatever its graph or weights hold."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back at once: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str) -> None:
    """Give a file the mode a plain ``open(path, "w")`` would have: ``mkstemp`` makes it 0600, which a
    runtime or a RASR job running as another user cannot read."""
    os.chmod(path, 0o666 & ~current_umask())


def write_text_atomically(path: str, text: str) -> None:
    """A text file beside a model (a report, a consumer's config) written whole and renamed into place, with
    the mode a plain ``open`` gives: a reader never sees half a file, and a failed write leaves nothing."""
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomically(proto: onnx.ModelProto, path: str, before_rename: Optional[Callable[[], None]] = None,
                     save: Optional[Callable[[onnx.ModelProto, str], Optional[str]]] = None) -> str:
    """Write ``proto`` to a temporary file beside ``path``, then rename it into place; the file's
    ``content_hash``.

    ``before_rename``: a last step once the file is complete (moving its data file into place).
    ``save``: how the file is written (default ``onnx.save``; ``weights.write_inline`` streams in weights
    kept in a file); it returns the hash of the bytes it wrote (``write_inline``: taken as they are written,
    not read back, 0.03-0.07 s less on 100 MiB of weights), or None to have the file read back for it.
    A write that fails (no room, say) is one ``OSError`` naming the path; nothing is left."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        try:
            digest = (save or onnx.save)(proto, tmp)
        except OSError as exc:
            raise WriteError(exc.errno, f"cannot write the ONNX model to {path!r}: {exc.strerror or exc}") from exc
        follow_umask(tmp)
        if before_rename is not None:
            before_rename()
        digest = digest or content_hash(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return digest
