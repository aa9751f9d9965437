"""Weights kept in a file while the graph is worked on in memory: models past protobuf's 2 GB, and any
model whose weights are big enough that copies of them would dominate the export's memory.

A ``ModelProto`` cannot be serialised past 2 GB, so such a model is never held
whole. The exporter writes it into a private folder beside the target path;
the graph is loaded without its weights, which are gathered into one data file
``<model>.onnx.data`` (page-aligned, so ONNX Runtime can map it instead of
copying it). Every session that checks the graph loads it from that folder,
and the finished model is moved into place with its data file, both renamed
within one filesystem, so a failure leaves neither file behind.

The same folder keeps the export's memory near the weights' size (``memory.py``, issue #29): held in
memory, one graph of a 97 M-parameter model was the TorchScript exporter's three copies of the weights
(C++ proto, its bytes, Python's bytes), a parsed proto, ONNX Runtime's bytes and session and its cleaned
graph side by side, 6.3x the weights above the start. From ``ON_DISK_FROM`` of weights on, every
export keeps them in the folder (``beside=False`` when they end up inside the one ``.onnx`` file:
streamed into it tensor by tensor at the end, ``write_inline``).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from typing import Iterator, Mapping, Optional

import onnx
import torch
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_model, uses_external_data

from onnx_compat.pipeline.files import follow_umask, write_atomically


# Weights from 1 GiB on go to a file: the graph and its metadata stay far from protobuf's 2 GB, and
# ``serialise + parse`` of gigabytes in Python costs more than a file the runtime can map.
IN_MEMORY_LIMIT = 1 << 30
# From here on the weights stay in a file during the export even when the model is written as one file.
ON_DISK_FROM = 16 << 20
PROTOBUF_LIMIT = 2 ** 31 - 1  # bytes of one serialised protobuf message
_ALIGN = 4096


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer (shared tensors once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def works_on_disk(size: int) -> bool:
    """Weights of ``size`` bytes are kept in a file during the export (``ON_DISK_FROM``)."""
    return size >= ON_DISK_FROM


_ONNX_TYPES = {getattr(torch, name): getattr(onnx.TensorProto, kind) for name, kind in (
    ("float32", "FLOAT"), ("float64", "DOUBLE"), ("float16", "FLOAT16"), ("bfloat16", "BFLOAT16"),
    ("int8", "INT8"), ("int16", "INT16"), ("int32", "INT32"), ("int64", "INT64"), ("uint8", "UINT8"),
    ("uint16", "UINT16"), ("uint32", "UINT32"), ("uint64", "UINT64"), ("bool", "BOOL"),
    ("complex64", "COMPLEX64"), ("complex128", "COMPLEX128"), ("float8_e4m3fn", "FLOAT8E4M3FN"),
    ("float8_e5m2", "FLOAT8E5M2"), ("float8_e4m3fnuz", "FLOAT8E4M3FNUZ"), ("float8_e5m2fnuz", "FLOAT8E5M2FNUZ"))
    if hasattr(torch, name) and hasattr(onnx.TensorProto, kind)}


def onnx_type(tensor: torch.Tensor) -> Optional[int]:
    """The ONNX element type of ``tensor``'s dtype, None for one ONNX has no type for."""
    return _ONNX_TYPES.get(tensor.dtype)


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, little-endian as ONNX stores them, without a copy when it is contiguous."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _point(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _location(proto: onnx.ModelProto) -> Optional[str]:
    places = {ExternalDataInfo(t).location for t in proto.graph.initializer if uses_external_data(t)}
    if len(places) > 1:
        raise ValueError(f"the graph's weights are spread over {sorted(places)}; expected one data file")
    return places.pop() if places else None


def _append_aligned(out, tensor: onnx.TensorProto, data: str, chunk) -> None:
    """``chunk`` written at the next aligned offset of the open data file ``out``, ``tensor`` pointed at it."""
    offset = -(-out.tell() // _ALIGN) * _ALIGN
    out.seek(offset)
    out.write(chunk)
    _point(tensor, data, offset, out.tell() - offset)


class _ExternalBytes:
    """The bytes of external tensors whose files lie in ``base``, each file opened once."""

    def __init__(self, base: str) -> None:
        self.base, self.handles = base, {}

    def read(self, tensor: onnx.TensorProto) -> bytes:
        info = ExternalDataInfo(tensor)
        if info.location not in self.handles:
            self.handles[info.location] = open(os.path.join(self.base, info.location), "rb")
        source = self.handles[info.location]
        source.seek(info.offset or 0)
        return source.read(info.length) if info.length else source.read()

    def __enter__(self) -> "_ExternalBytes":
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles.values():
            handle.close()


class WeightsFolder:
    """The private folder beside ``path`` where graphs of this export keep their weights.

    Each step that writes weights (the exporter, the optimiser) gets a data file of its own
    (``<step>.data``), so a graph in memory always refers to its own weights, and a step's
    result that is not kept leaves the graph before it untouched.
    """

    def __init__(self, path: str, beside: bool = True):
        self.target = path
        self.beside = beside  # the weights are written beside the model (else inside its one file)
        self.name = os.path.basename(path)
        self.dir = tempfile.mkdtemp(prefix=f".{self.name}.", suffix=".weights", dir=os.path.dirname(path))

    def step_path(self, step: str) -> str:
        """Where one step (an exporter, an optimiser) writes its model, in a sub-folder of its own. A step
        run again (the cleanup of the other exporter's graph, when ``auto`` times both) gets a new name, so
        the weights of every graph still in use stay where it points."""
        folder = os.path.join(self.dir, self._fresh(step))
        os.makedirs(folder)
        return os.path.join(folder, self.name)

    def _fresh(self, step: str) -> str:
        """``step``, or ``step-2``, ``step-3``... when a graph's folder or data file has that name already."""
        name, k = step, 1
        while os.path.exists(os.path.join(self.dir, name)) or os.path.exists(os.path.join(self.dir, name + ".data")):
            k += 1
            name = f"{step}-{k}"
        return name

    def adopt(self, written: str, step: str) -> onnx.ModelProto:
        """The graph at ``written`` (``step_path``'s), loaded without its weights, which go to this folder's
        ``<step>.data`` (the step's folder name): external tensors are copied one at a time, inline ones of
        1 KiB and more are moved out."""
        proto = onnx.load(written, load_external_data=False)
        base = os.path.dirname(written)
        data = f"{os.path.basename(base) if base != self.dir else step}.data"
        if self._move_single_file(proto, base, data):
            shutil.rmtree(base, ignore_errors=True)
            return proto
        with _ExternalBytes(base) as external, open(os.path.join(self.dir, data), "wb") as out:
            for tensor in proto.graph.initializer:
                if uses_external_data(tensor):
                    chunk = external.read(tensor)
                elif len(tensor.raw_data) >= 1024:
                    chunk = tensor.raw_data
                    tensor.ClearField("raw_data")
                else:
                    continue
                _append_aligned(out, tensor, data, chunk)
                del chunk
        if base != self.dir:
            shutil.rmtree(base, ignore_errors=True)
        return proto

    def take(self, proto: onnx.ModelProto, tensors: Mapping[str, torch.Tensor], step: str) -> onnx.ModelProto:
        """The graph inputs named in ``tensors`` become initializers whose data goes straight from those
        tensors to this folder's ``<step>.data``, one at a time: the TorchScript exporter's graph without
        its weights (``capture.py``), never a copy of them all in memory."""
        data, declared = f"{self._fresh(step)}.data", [v for v in proto.graph.input if v.name not in tensors]
        taken = [v.name for v in proto.graph.input if v.name in tensors]
        with open(os.path.join(self.dir, data), "wb") as out:
            for name in taken:
                value = tensors[name]
                tensor = onnx.TensorProto(name=name, dims=list(value.shape), data_type=onnx_type(value))
                chunk = _tensor_bytes(value)
                if chunk.nbytes < 1024:
                    tensor.raw_data = chunk.tobytes()
                else:
                    _append_aligned(out, tensor, data, chunk)
                del chunk
                proto.graph.initializer.append(tensor)
        del proto.graph.input[:]
        proto.graph.input.extend(declared)
        return proto

    def _move_single_file(self, proto: onnx.ModelProto, base: str, data: str) -> bool:
        """When every weight is already in one data file (the dynamo exporter's, ONNX Runtime's), that file is
        renamed instead of copied: gigabytes not written twice."""
        tensors = [t for t in proto.graph.initializer if uses_external_data(t)]
        inline = any(len(t.raw_data) >= 1024 for t in proto.graph.initializer if not uses_external_data(t))
        infos = [ExternalDataInfo(t) for t in tensors]
        places = {info.location for info in infos}
        if inline or len(places) != 1 or any(info.length is None for info in infos):
            return False
        os.replace(os.path.join(base, places.pop()), os.path.join(self.dir, data))
        for tensor, info in zip(tensors, infos):
            _point(tensor, data, info.offset or 0, info.length)
        return True

    def save_graph(self, proto: onnx.ModelProto, name: Optional[str] = None) -> str:
        """The graph written beside its weights, for a session or a runtime that loads from a path
        (``name``: a file of its own, for a graph loaded while another one is)."""
        path = os.path.join(self.dir, name or self.name)
        onnx.save(proto, path)
        return path

    def commit(self, proto: onnx.ModelProto) -> str:
        """Write the graph beside the target path, then move the data file and the graph into place
        (``beside=False``: one file, the weights streamed into it); the ``content_hash`` of the model file.

        A failure before the renames (no room for the graph, say) changes nothing at the target path.
        The two renames are not one atomic step: a crash between them leaves the new data file beside
        the previous graph."""
        if not self.beside:
            return write_atomically(proto, self.target, save=lambda graph, path: write_inline(graph, self.dir, path))
        location = _location(proto)
        data = os.path.basename(self.target) + ".data"
        for tensor in proto.graph.initializer:
            if uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                _point(tensor, data, info.offset, info.length)
        then = None if location is None else \
            (lambda: _into_place(os.path.join(self.dir, location), self.target + ".data"))
        return write_atomically(proto, self.target, before_rename=then)

    def inline(self, proto: onnx.ModelProto) -> None:
        """The weights back inside ``proto`` (for a step that reads the whole model: a contract's
        consumers, quantization)."""
        load_external_data_for_model(proto, self.dir)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def folder_for(path: str, needed: bool, beside: bool = True) -> Iterator[Optional[WeightsFolder]]:
    """A ``WeightsFolder`` beside ``path`` when ``needed``, removed afterwards whatever happened."""
    if not needed:
        yield None
        return
    folder = WeightsFolder(path, beside)
    try:
        yield folder
    finally:
        folder.close()


def write_inline(proto: onnx.ModelProto, base: str, path: str) -> str:
    """``proto`` as one file at ``path``, its external weights (in ``base``) read into it one at a time;
    the ``content_hash`` of the bytes written.

    Protobuf merges repeated occurrences of a message field, so the graph without weights followed by one
    ``ModelProto(graph=GraphProto(initializer=[t]))`` per tensor parses as the model with its initializers
    in order: the file ``onnx.save`` would write, without the whole model in memory as bytes."""
    shell = onnx.ModelProto()
    shell.CopyFrom(proto)
    del shell.graph.initializer[:]
    digest = hashlib.sha256()
    with _ExternalBytes(base) as external, open(path, "wb") as out:
        data = shell.SerializeToString()
        digest.update(data)
        out.write(data)
        del shell, data
        for tensor in proto.graph.initializer:
            piece = onnx.ModelProto()
            inside = piece.graph.initializer.add()
            inside.CopyFrom(tensor)
            if uses_external_data(tensor):
                del inside.external_data[:]
                inside.data_location = onnx.TensorProto.DEFAULT
                inside.raw_data = external.read(tensor)
            data = piece.SerializeToString()
            digest.update(data)
            out.write(data)
            del piece, inside, data
    return "sha256:" + digest.hexdigest()


def _into_place(source: str, target: str) -> None:
    """A finished data file to its place, with the mode any file written there would have."""
    follow_umask(source)
    os.replace(source, target)
