"""``export_parts``: several graphs from callables sharing ``StateSpec``s, each through ``export()``.

declarations checked (names, states, batch axes) -> each part probed in
eager PyTorch (every input used) -> each part exported and verified at new
shapes by the normal ``export()`` pipeline into a temporary folder beside
the target (a part without inputs is a constant graph, run and compared) ->
batch-1 state dims written into the graph where the part fixes them -> the
states compared across graphs -> ``checks`` (a consumer's rules) on the
graphs -> the files moved into the folder. Nothing is written unless every
graph exported, verified and agreed.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import onnx

from onnx_compat.streaming.states import StateSpec

from ..model_state import preserved
from ..pipeline.files import current_umask
from ..pipeline.report import Report
from ..pipeline.steps import Step
from ..spec import dim_sizes
from .consistency import check_states_agree
from .constant import constant_graph, verify_constant
from .errors import GraphContractError
from .part import Part, PartModule, batch_axis, state_specs
from .probe import check_inputs_used, example_feeds, outputs_of


@dataclass
class PartsReport:
    """What ``export_parts`` wrote: a ``Report`` per exported graph, the files, the states as each graph holds them."""

    folder: str
    graphs: Dict[str, Report] = field(default_factory=dict)
    files: Dict[str, str] = field(default_factory=dict)
    states: Dict[str, List[dict]] = field(default_factory=dict)
    constant: List[str] = field(default_factory=list)  # parts written as constant graphs
    steps: Dict[str, Dict[str, dict]] = field(default_factory=dict)  # per graph: what each of its steps did

    def to_dict(self) -> dict:
        return {"folder": self.folder, "files": dict(self.files), "states": self.states, "constant": self.constant,
                "steps": self.steps,
                "graphs": {name: {"exporter": r.exporter, "why": r.why, "inputs": r.inputs, "outputs": r.outputs,
                                  "nodes": r.nodes, "max_abs_err": r.max_abs_err, "verification": r.verification,
                                  "seconds": {k: round(v, 3) for k, v in r.timings.items()}}
                           for name, r in self.graphs.items()}}


def _check_declarations(parts: Sequence[Part], states: Mapping[str, StateSpec], batch: str) -> None:
    names = [p.name for p in parts]
    if len(set(names)) != len(names) or not parts:
        raise GraphContractError(f"parts need distinct names, got {names}", rule="distinct graph names")
    for part in parts:
        for state in list(part.states_in) + list(part.states_out):
            if state not in states:
                raise GraphContractError(f"graph {part.name!r} names state {state!r}, which no StateSpec declares "
                                         f"(states: {list(states)})", graph=part.name, tensor=state,
                                         rule="states declared")
        io = [n for s in list(part.inputs) + list(part.outputs) for n in s.onnx_names] + list(part.state_io())
        clash = sorted({n for n in io if io.count(n) > 1})
        if clash:
            raise GraphContractError(f"graph {part.name!r}: names {clash} are used twice", graph=part.name,
                                     tensor=clash[0], rule="unique I/O names")
    for spec in states.values():
        batch_axis(spec, batch)


def export_parts(parts: Sequence[Part], folder: str, states: Sequence[StateSpec], *, batch: str = "batch",
                 batch_first: bool = False, exporter: Union[str, Mapping[str, str]] = "auto", sizes: Optional[Mapping[str, int]] = None,
                 atol: float = 1e-4, rtol: float = 1e-3, opset: Optional[int] = None, seed: int = 0,
                 checks: Sequence[Callable[[Dict[str, onnx.ModelProto]], None]] = (),
                 extra_files: Optional[Mapping[str, str]] = None, shared_dims: Sequence[str] = (),
                 progress: Optional[Callable[[str], None]] = None) -> PartsReport:
    """Export each part to ``<folder>/<part name>.onnx``; return the ``PartsReport``.

    ``sizes``: example sizes of named dims, across graphs (each export gets those of its inputs).
    ``batch``: the name of the batch ``Dim`` every state has. ``batch_first``: states held batch-first in
    every graph. ``exporter``: one for every graph, or ``{part name: exporter}`` (the others ``"auto"``). ``checks``: functions of ``{part name: graph}`` raising on a broken rule (a consumer's
    loader), run before anything is written. ``extra_files``: ``{file name: text}`` written beside them.
    ``shared_dims``: named non-batch state dims every hypothesis of one call shares (an encoder's frames),
    allowed symbolic when every graph names them alike. ``progress``: told each graph's export stages
    (``"encoder: capture (dynamo)"``) and the checks, as ``export(progress=)`` is: a command prints them.
    """
    table = {s.name: s for s in states}
    _check_declarations(parts, table, batch)
    exporters = _exporters(exporter, [p.name for p in parts])
    os.makedirs(os.path.dirname(os.path.abspath(folder)) or ".", exist_ok=True)
    parent = os.path.dirname(os.path.abspath(folder))
    report = PartsReport(os.path.abspath(folder))
    for part in parts:  # every part probed before the first export: a bad part costs no export time
        _probe(part, table, batch, batch_first, sizes, seed)
    with tempfile.TemporaryDirectory(prefix=".parts-", dir=parent) as tmp:
        protos = {}
        for part in parts:
            path = os.path.join(tmp, f"{part.name}.onnx")
            protos[part.name] = _export_one(part, path, table, batch, batch_first, exporters[part.name], sizes, atol, rtol,
                                            opset, seed, report, _prefixed(progress, part.name))
        report.states = check_states_agree(protos, {p.name: p for p in parts}, batch_first, shared_dims)
        if progress is not None and checks:
            progress("checking the graphs together")
        for check in checks:
            check(protos)
        for name, text in (extra_files or {}).items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        _move_into(tmp, report.folder, [f"{p.name}.onnx" for p in parts] + list(extra_files or {}), report)
    return report


def _exporters(exporter, names: Sequence[str]) -> Dict[str, str]:
    if isinstance(exporter, str):
        return {name: exporter for name in names}
    unknown = sorted(set(exporter) - set(names))
    if unknown:
        raise GraphContractError(f"exporter= names {unknown}, which are not graphs here ({list(names)})",
                                 graph=unknown[0], rule="exporter per graph")
    return {name: exporter.get(name, "auto") for name in names}


def _prefixed(progress: Optional[Callable[[str], None]], name: str) -> Optional[Callable[[str], None]]:
    """``progress`` with each stage said as the graph's (``"encoder: capture (dynamo)"``)."""
    return None if progress is None else (lambda stage: progress(f"{name}: {stage}"))


def _export_one(part: Part, path: str, table, batch, batch_first, exporter, sizes, atol, rtol, opset, seed,
                report: PartsReport, progress: Optional[Callable[[str], None]] = None) -> onnx.ModelProto:
    from onnx_compat import export
    inputs, outputs = state_specs(part, table, batch, batch_first)
    module = PartModule(part, table, batch, batch_first)
    steps = [StaticStateDims(part, outputs)] + list(part.steps)
    with preserved(module):
        if not inputs:
            values = outputs_of(module, {})
            proto = constant_graph(part.name, values, outputs, dict(part.metadata))
            verify_constant(proto, values, part.name)
            for step in steps:  # what export() would have run on it
                step.before_write(None, None, proto)
            report.steps[part.name] = {s.name: s.describe() for s in steps}
            report.constant.append(part.name)
            onnx.save(proto, path)
            return proto
        sizes = _own_sizes(inputs, sizes) or None
        try:
            graph = export(module, path, inputs, outputs, exporter=exporter, sizes=sizes, atol=atol, rtol=rtol,
                           opset=opset, seed=seed, metadata=dict(part.metadata), external_data=False, steps=steps,
                           progress=progress)
        except Exception as exc:
            exc.add_note(f"(while exporting graph {part.name!r})")  # the error keeps its type and fields
            raise
    report.graphs[part.name] = graph
    report.steps[part.name] = dict(graph.steps)
    return onnx.load(path)


class StaticStateDims(Step):
    """A declared static state dim (the initializer's batch 1) that the exporter left symbolic is written
    into the graph's output shape: the verification ran the graph and saw that size. It runs first, so the
    steps after it see the shapes a consumer will."""

    name = "parts-static-dims"

    def __init__(self, part: Part, outputs) -> None:
        self.part, self.outputs, self.changed = part, outputs, []

    def before_write(self, request, report, proto) -> None:
        self.changed = _stamp_static_batch(proto, self.part, self.outputs)

    def describe(self) -> dict:
        return {"stamped": list(self.changed)}


def _probe(part: Part, table, batch, batch_first, sizes, seed) -> None:
    inputs, _ = state_specs(part, table, batch, batch_first)
    if inputs:
        module = PartModule(part, table, batch, batch_first)
        with preserved(module):
            check_inputs_used(part.name, module, inputs, example_feeds(inputs, dim_sizes(inputs, _own_sizes(inputs, sizes)),
                                                                       seed))


def _own_sizes(inputs, sizes: Optional[Mapping[str, int]]) -> Dict[str, int]:
    """The sizes of the dims this graph's inputs have (``sizes`` is shared by every graph)."""
    known = {d.name for spec in inputs for d in spec.dynamic_axes().values()}
    return {k: v for k, v in (sizes or {}).items() if k in known}


def _stamp_static_batch(proto: onnx.ModelProto, part: Part, outputs) -> List[str]:
    declared = {s.name: s.dims for s in outputs}
    changed = []
    for value in proto.graph.output:
        dims = declared.get(value.name)
        if dims is None or value.name not in part.state_io():
            continue
        for axis, (dim, want) in enumerate(zip(value.type.tensor_type.shape.dim, dims)):
            if isinstance(want, int) and not dim.HasField("dim_value"):
                changed.append(f"{value.name} dim {axis}: {dim.dim_param or '?'} -> {want}")
                dim.Clear()
                dim.dim_value = want
    return changed


def _move_into(tmp: str, folder: str, names: Sequence[str], report: PartsReport) -> None:
    """Into the folder last: a new folder is renamed whole; into an existing one, file by file."""
    if not os.path.exists(folder):
        staged = tempfile.mkdtemp(prefix=".parts-staged-", dir=os.path.dirname(folder))
        for name in names:
            shutil.move(os.path.join(tmp, name), os.path.join(staged, name))
        os.chmod(staged, 0o777 & ~current_umask())
        os.replace(staged, folder)
    else:
        if not os.path.isdir(folder):
            raise GraphContractError(f"cannot write the graphs into {folder!r}: it is a file", rule="folder")
        for name in names:
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    for name in names:
        if name.endswith(".onnx"):
            report.files[name[:-5]] = os.path.join(folder, name)
        else:
            report.files[name] = os.path.join(folder, name)
