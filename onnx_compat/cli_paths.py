"""Every file a command reads and writes, named before any work starts, and checked as one set.

Each verb says what its options make it read and write (its ``files(args)``,
called by ``onnx_compat.cli`` before ``run``): the model it reads, the
report it writes, the weights file beside a model, the float model beside a
quantized one, the files a contract or a checkpoint folder puts beside it.
``Files.check`` then refuses, before a minute of work and with nothing
touched, as a ``UsageError`` naming the options (exit code 2):

- an output that cannot be written: a directory, a folder that does not
  exist, something that is not a regular file (``/dev/null``), a folder
  that refuses a new file (``/proc``, a read-only mount, no permission; tried
  with a file made and removed at once, since ``os.access`` says yes to root
  everywhere);
- an input that does not exist;
- two outputs that are one file (``--out d.onnx --json d.onnx`` once wrote
  the report over the verified model), or an output that is an input (the
  float model ``quantize`` reads, the model ``verify`` checks): paths are
  compared resolved (``./d.onnx``, ``d.onnx``, a symlink to it and a hard
  link are one file).

Below every CLI module, like ``cli_args.py``; it imports ``errors`` and, for the write test,
``pipeline.files``.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from onnx_compat.errors import UsageError


@dataclass(frozen=True)
class Role:
    """One path a command uses: the option that names it and what it is, for the message."""

    option: str  # the option (or argument) that names it: "--out", "--json", "onnx", "hf:DIR"
    path: str  # as given, made absolute
    what: str  # "the ONNX model", "the report"
    folder: bool = False  # a folder (label-scorer's --out, hf:DIR) rather than a file

    def identity(self) -> Tuple:
        """What makes two paths one file: the inode when it exists (hard links, symlinks), else the resolved
        path (``./a/../d.onnx`` is ``d.onnx``)."""
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            return ("inode", st.st_dev, st.st_ino)
        return ("path", os.path.realpath(self.path))


@dataclass
class Files:
    """What one command will read and write; ``check()`` refuses the set before any work."""

    reads: List[Role] = field(default_factory=list)
    writes: List[Role] = field(default_factory=list)

    def read(self, path: Optional[str], option: str, what: str, folder: bool = False) -> "Files":
        if path is not None:
            self.reads.append(Role(option, os.path.abspath(os.fspath(path)), what, folder))
        return self

    def read_model(self, path: str, option: str, what: str) -> "Files":
        """A model to read, and the weights files its graph points at (``model.onnx.data``)."""
        self.read(path, option, what)
        for data in weights_files(path):
            self.read(data, option, f"the weights file of {what}")
        return self

    def write(self, path: Optional[str], option: str, what: str, folder: bool = False) -> "Files":
        if path is not None:
            self.writes.append(Role(option, os.path.abspath(os.fspath(path)), what, folder))
        return self

    def check(self) -> "Files":
        """Every input there, every output writable, no two of them one file; a ``UsageError`` otherwise."""
        for role in self.writes:
            (_writable_folder if role.folder else _writable_file)(role)
        for role in self.reads:
            _exists(role)
        _no_collision(self.writes, self.reads)
        return self


def _refuse(role: Role, why: str) -> UsageError:
    return UsageError(f"{role.option}: cannot write {role.what} to {role.path!r}: {why}", option=role.option)


def _exists(role: Role) -> None:
    there = os.path.isdir(role.path) if role.folder else os.path.isfile(role.path)
    if not there:
        kind = "folder" if role.folder else "file"
        raise UsageError(f"{role.option}: no such {kind} {role.path!r} ({role.what})", option=role.option)


def _writable_file(role: Role) -> None:
    """A file output: not a directory nor a device, in a folder that exists and takes a new file."""
    if os.path.isdir(role.path):
        raise _refuse(role, "it is a directory")
    if os.path.exists(role.path) and not os.path.isfile(role.path):
        raise _refuse(role, "it is not a regular file (the file written would replace it)")
    folder = os.path.dirname(role.path)
    if not os.path.isdir(folder):
        raise _refuse(role, f"folder {folder!r} does not exist")
    _takes_a_file(role, folder)


def _writable_folder(role: Role) -> None:
    """A folder output: a folder (or nothing yet) whose parent exists; where the files go takes a new file."""
    if os.path.exists(role.path) and not os.path.isdir(role.path):
        raise _refuse(role, "a file is there, not a folder")
    parent = os.path.dirname(role.path)
    if not os.path.isdir(parent):
        raise _refuse(role, f"folder {parent!r} does not exist")
    _takes_a_file(role, role.path if os.path.isdir(role.path) else parent)


def _takes_a_file(role: Role, folder: str) -> None:
    """``folder`` takes a new file (``pipeline.files.refuses_a_file``: tried, since ``os.access`` says yes to
    root everywhere, ``/proc`` included)."""
    from onnx_compat.pipeline.files import refuses_a_file
    why = refuses_a_file(folder)
    if why:
        raise _refuse(role, f"folder {folder!r} is not writable ({why})")


def _no_collision(writes: List[Role], reads: List[Role]) -> None:
    """Two outputs that are one file, or an output that is an input: the later would destroy the other."""
    seen = {}
    for role, read in [(r, True) for r in reads] + [(w, False) for w in writes]:
        first, first_read = seen.setdefault(role.identity(), (role, read))
        if first is role or (read and first_read):
            continue  # reading one file twice harms nothing
        verb = "reads" if first_read else "writes"
        raise UsageError(f"{role.option} {role.path!r} is the file {first.option} {verb} ({first.what}): "
                         f"writing {role.what} there would destroy it; choose another path", option=role.option)


def weights_files(model: str) -> List[str]:
    """The external weights files ``model``'s graph names, read without its weights. A file that does not
    load has none here: the verb's own load names what is wrong with it (exit 1, ``ModelFileError``)."""
    if not os.path.isfile(model):
        return []
    import onnx
    try:
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # noqa: BLE001 - damaged: named by the verb's load, with the reason
        return []
    folder = os.path.dirname(os.path.abspath(model))
    found = []
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            where = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if where and os.path.join(folder, where) not in found:
                found.append(os.path.join(folder, where))
    return found
