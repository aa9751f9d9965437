"""What a consumer (a runtime that loads our models by its own rules) assumes, as data.

A consumer such as sherpa-onnx binds inputs and outputs by position, reads
its configuration from ``metadata_props`` and ends the process when a key is
missing. A ``Contract`` declares those assumptions -- the ports in order
(dtype and layout), the metadata keys with their allowed values, the files
written beside the model -- and checks them on the graph before anything is
written, so a violation is one ``ContractError`` at export time instead of a
crash in the deployed binary.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import onnx
import torch

from ..errors import OnnxCompatError
from ..graph import load, value_info
from ..pipeline.files import write_text_atomically

# Axis kinds in a port's layout: how the consumer feeds or reads that axis.
BATCH = "batch"      # symbolic, or 1 (the consumer may feed one item at a time)
DYNAMIC = "dynamic"  # symbolic: the consumer feeds any size
STATIC = "static"    # a fixed number (feature or class count)


@dataclass(frozen=True)
class Finding:
    """One broken assumption: ``what`` (port, metadata key, file), expected and got; ``fix``: what to change,
    when the finding can say it."""

    what: str
    expected: str
    got: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.what}: expected {self.expected}, got {self.got}" + (f"; to fix: {self.fix}" if self.fix else "")


class ContractError(OnnxCompatError, ValueError):
    """The model (or its specs) cannot satisfy the consumer's contract; nothing was written."""

    def __init__(self, contract: str, findings: Sequence[Finding]):
        self.contract = contract
        self.findings = list(findings)
        first = self.findings[0]
        self.what, self.expected, self.got, self.fix = first.what, first.expected, first.got, first.fix
        more = "".join(f"; {f.line()}" for f in self.findings[1:])
        super().__init__(f"contract {contract!r}: {first.line()}{more}")


@dataclass(frozen=True)
class Axis:
    letter: str  # the consumer's name for the axis: N, C, T, V, D
    kind: str    # BATCH, DYNAMIC or STATIC

    def check(self, got) -> Optional[str]:
        """Why ``got`` (a graph dim: name, number or None) breaks this axis, or None."""
        if self.kind == BATCH and not (isinstance(got, str) or got == 1):
            return f"batch {self.letter} symbolic or 1"
        if self.kind == DYNAMIC and not isinstance(got, str):
            return f"{self.letter} symbolic"
        if self.kind == STATIC and not isinstance(got, int):
            return f"{self.letter} static"
        return None


def axes(layout: str) -> Tuple[Axis, ...]:
    """``"N:batch C:static T:dynamic"`` -> Axis objects."""
    return tuple(Axis(*part.split(":")) for part in layout.split())


@dataclass(frozen=True)
class Port:
    """One input or output at a fixed position: what the consumer puts there or reads from there."""

    role: str
    dtype: str               # ONNX element type name: "float", "int64", "int32"
    layout: Tuple[Axis, ...]

    def findings(self, where: str, info: Optional[dict]) -> List[Finding]:
        label = f"{where} ({self.role})"
        shape = "[" + ", ".join(a.letter for a in self.layout) + "]"
        if info is None:
            return [Finding(label, f"{self.dtype} {shape}", "no such port in the graph")]
        name = f"{label} {info['name']!r}"
        out = []
        if info["dtype"] != self.dtype:
            out.append(Finding(f"{name} dtype", self.dtype, info["dtype"]))
        if len(info["dims"]) != len(self.layout):
            return out + [Finding(f"{name} rank", f"{len(self.layout)} {shape}", f"{len(info['dims'])} {info['dims']}")]
        for i, (axis, got) in enumerate(zip(self.layout, info["dims"])):
            wrong = axis.check(got)
            if wrong:
                out.append(Finding(f"{name} dim {i} ({axis.letter}) of {shape}", wrong, repr(got)))
        return out

    def spec_layout_findings(self, where: str, name: str, dims) -> List[Finding]:
        """A declared ``TensorSpec``'s dims against the layout: a ``Dim`` is symbolic, an int static."""
        shape = "[" + ", ".join(a.letter for a in self.layout) + "]"
        found = []
        for i, (axis, dim) in enumerate(zip(self.layout, dims)):
            got = dim if isinstance(dim, int) else getattr(dim, "name", "symbolic")
            wrong = axis.check(got if isinstance(dim, int) else str(got))
            if wrong:
                found.append(Finding(f"{where} ({self.role}) {name!r} dim {i} ({axis.letter}) of {shape}", wrong,
                                     f"Dim({got!r})" if not isinstance(dim, int) else repr(dim)))
        return found

    def spec_dtype_ok(self, dtype: torch.dtype) -> bool:
        return str(dtype).replace("torch.", "").replace("float32", "float") == self.dtype


@dataclass(frozen=True)
class MetaKey:
    """A ``metadata_props`` entry the consumer reads. ``allowed``: the values it accepts (None: any
    value ``parse`` takes). ``derive``: computes the value from the graph and options when the user
    gave none (None: the user must give it)."""

    key: str
    why: str
    allowed: Optional[Tuple[str, ...]] = None
    parse: Callable[[str], object] = str
    derive: Optional[Callable[["Context"], Optional[str]]] = None
    required: bool = True

    def finding(self, value: Optional[str]) -> Optional[Finding]:
        where = f"metadata {self.key!r} ({self.why})"
        if value is None and not self.required:
            return None
        if value is None:
            return Finding(where, "a value" + (f" from {list(self.allowed)}" if self.allowed else ""), "missing")
        if self.allowed is not None and value not in self.allowed:
            return Finding(where, f"one of {list(self.allowed)}", repr(value))
        try:
            self.parse(value)
        except ValueError:
            return Finding(where, f"a {self.parse.__name__} value", repr(value))
        return None


def non_negative_int(value: str) -> int:
    """A consumer reading numbers with ``atoi`` and refusing negatives."""
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(value)
    return number


@dataclass
class Context:
    """What a contract's checks see: the graph, its ports in order, the user's metadata and options."""

    proto: onnx.ModelProto
    inputs: List[dict]
    outputs: List[dict]
    metadata: Dict[str, str]
    vocabulary: Optional[Sequence[str]] = None
    options: Dict[str, object] = field(default_factory=dict)  # the contract's own (e.g. RASR's feature_dim)
    notes: List[str] = field(default_factory=list)
    cache: Dict[str, object] = field(default_factory=dict)   # probes share an ONNX Runtime session here

    @classmethod
    def of(cls, proto, vocabulary=None, options=None) -> "Context":
        proto = load(proto)
        return cls(proto, [value_info(v) for v in proto.graph.input], [value_info(v) for v in proto.graph.output],
                   {p.key: p.value for p in proto.metadata_props}, vocabulary, dict(options or {}))

    def session(self):
        """An ONNX Runtime session of the graph, made once (one thread: probes are small runs)."""
        if "session" not in self.cache:
            from onnx_compat.runtimes.session import open_session
            self.cache["session"] = open_session(self.proto, threads=1)
        return self.cache["session"]


@dataclass(frozen=True)
class Contract:
    """A consumer's contract. ``probes``: checks that run the graph (``(context) -> findings``);
    ``files``: ``(context) -> {file name: text}`` written beside the model; ``consumers``: objects
    with ``name``, ``available()`` and ``verify(folder, model_file, model, context)``."""

    name: str
    consumer: str
    inputs: Tuple[Port, ...]
    outputs: Tuple[Port, ...]
    metadata: Tuple[MetaKey, ...] = ()
    exact_inputs: bool = True  # the consumer feeds exactly these inputs, nothing else
    probes: Tuple[Callable[[Context], List[Finding]], ...] = ()
    files: Optional[Callable[[Context], Dict[str, str]]] = None
    consumers: Tuple[object, ...] = ()

    def check_specs(self, inputs, outputs) -> List[Finding]:
        """Before exporting: the declared ``TensorSpec`` lists in ONNX order against the ports."""
        names = [(n, s, a) for s in inputs for n, a in zip(s.onnx_names, [None, *s.lengths])]
        found = []
        if self.exact_inputs and len(names) != len(self.inputs):
            found.append(Finding("inputs", f"{len(self.inputs)} ({', '.join(p.role for p in self.inputs)})",
                                 f"{len(names)} {[n for n, _, _ in names]}"))
        for i, (port, (name, spec, axis)) in enumerate(zip(self.inputs, names)):
            dtype = spec.dtype if axis is None else spec.lengths_dtype
            rank = len(spec.dims) if axis is None else 1
            dims = spec.dims if axis is None else (spec.dims[0],)
            if not port.spec_dtype_ok(dtype) or rank != len(port.layout):
                found.append(Finding(f"input {i} ({port.role}) {name!r}",
                                     f"{port.dtype} of rank {len(port.layout)}",
                                     f"{str(dtype).replace('torch.', '')} of rank {rank}"))
            else:
                found += port.spec_layout_findings(f"input {i}", name, dims)
        outs = [n for s in outputs for n in s.onnx_names]
        if len(outs) < len(self.outputs):
            found.append(Finding("outputs", f"at least {len(self.outputs)}", f"{outs}"))
        return found

    def check(self, proto, vocabulary=None, user_metadata: Optional[Mapping[str, str]] = None,
              options: Optional[Mapping[str, object]] = None) -> "Applied":
        """Before writing: fill in the metadata the contract can derive, then every check on the graph.
        Returns what to write; raises ``ContractError`` with every finding."""
        ctx = Context.of(proto, vocabulary, options)
        ctx.metadata.update(dict(user_metadata or {}))
        found = self._port_findings(ctx)
        ports_ok = not found
        # every finding at once: derived values need the ports and the probes run the graph, so with a broken
        # port only the values the user gave are checked; otherwise the metadata and every probe (a probe that
        # needs a key with a finding of its own skips itself)
        written = self._fill_metadata(ctx) if ports_ok else {}
        found += [f for key in self.metadata if ports_ok or key.key in ctx.metadata or key.derive is None
                  for f in [key.finding(ctx.metadata.get(key.key))] if f]
        if ports_ok:
            for probe in self.probes:
                found += probe(ctx)
        files = self.files(ctx) if self.files and not found else {}
        if found:
            raise ContractError(self.name, found)
        return Applied(self, written, files, ctx.notes, {"inputs": ctx.inputs, "outputs": ctx.outputs},
                       list(vocabulary) if vocabulary is not None else None)

    def _port_findings(self, ctx: Context) -> List[Finding]:
        found = []
        for kind, ports, infos in (("input", self.inputs, ctx.inputs), ("output", self.outputs, ctx.outputs)):
            for i, port in enumerate(ports):
                found += port.findings(f"{kind} {i}", infos[i] if i < len(infos) else None)
        if self.exact_inputs and len(ctx.inputs) > len(self.inputs):
            extra = [v["name"] for v in ctx.inputs[len(self.inputs):]]
            found.append(Finding("inputs", f"exactly {len(self.inputs)} (the consumer feeds no others)",
                                 f"extra inputs {extra}"))
        return found

    def _fill_metadata(self, ctx: Context) -> Dict[str, str]:
        """The contract's keys as they will be written: the user's values, else derived ones."""
        for key in self.metadata:
            if key.key not in ctx.metadata and key.derive is not None:
                value = key.derive(ctx)
                if value is not None:
                    ctx.metadata[key.key] = value
        return {k.key: ctx.metadata[k.key] for k in self.metadata if k.key in ctx.metadata}


@dataclass
class Applied:
    """A contract that held: the metadata to set, the files to write beside the model, notes for the report."""

    contract: Contract
    metadata: Dict[str, str]
    files: Dict[str, str]
    notes: List[str]
    io: Dict[str, List[dict]] = field(default_factory=dict)  # the graph's ports in order, as checked
    vocabulary: Optional[List[str]] = None
    consumer_checks: List[dict] = field(default_factory=list)

    def write_files(self, folder: str) -> List[str]:
        """The contract's files beside the model (each written whole, then renamed into place)."""
        paths = []
        for name, text in self.files.items():
            path = os.path.join(folder, name)
            write_text_atomically(path, text)
            paths.append(path)
        return paths

    def verify_in_consumer(self, proto, model, inputs, only: Optional[Sequence[str]] = None) -> List[dict]:
        """Run the model in each of the contract's consumers that is installed, from a folder holding it and its
        files as they will be written; a consumer not installed is listed with the reason. Raises the consumer's
        mismatch (``ConsumerMismatch``) on the first difference from eager PyTorch."""
        import onnx
        with tempfile.TemporaryDirectory(prefix="onnx_compat_consumer_") as folder:
            model_file = os.path.join(folder, "model.onnx")
            onnx.save(proto, model_file)
            self.write_files(folder)
            for consumer in self.contract.consumers:
                if only is not None and consumer.name not in only:
                    continue
                missing = consumer.available()
                if missing:
                    self.consumer_checks.append({"consumer": consumer.name, "ok": None, "skipped": missing})
                    continue
                self.consumer_checks.append(consumer.verify(folder, model_file, model, inputs, self, self.vocabulary))
        return self.consumer_checks

    def to_dict(self) -> dict:
        return {"name": self.contract.name, "consumer": self.contract.consumer, "metadata": self.metadata,
                "files": sorted(self.files), "notes": self.notes, "consumer_checks": self.consumer_checks}
