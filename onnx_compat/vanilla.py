"""What plain ``torch.onnx.export`` does with a model: the baseline we compare against.

The same specs, names and dynamic dims as the pipeline, but no patches and no
cleanup, then the same checks (dims, load, ONNX Runtime against eager at new
shapes). The answer is one line a table can hold.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

import onnx
import torch

from . import exporters, graph
from .io_adapter import IOAdapter, check_outputs, flatten
from .safety import preserved
from .spec import TensorSpec, dim_sizes, forward_arguments, make_inputs
from .verify import VerificationError, verify


@dataclass
class Outcome:
    stage: str  # "ok", "export", "dims", "load", "run", "numbers"
    detail: str = ""
    nodes: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.stage == "ok"

    def __str__(self) -> str:
        if self.ok:
            return f"ok ({self.nodes} nodes)"
        what = {"export": "export fails", "dims": "dim baked", "load": "does not load",
                "run": "ORT fails at new shapes", "numbers": "wrong numbers at new shapes"}[self.stage]
        return f"{what}: {self.detail}"


def _stage(message: str) -> str:
    if message.startswith("the ONNX model does not load"):
        return "load"
    return "run" if "ONNX Runtime run failed" in message else "numbers"


def _verification_detail(message: str) -> str:
    """ONNX Runtime's own words, without the sizes prefix and the source path."""
    sizes = re.match(r"at sizes (\{[^}]*\}): ", message)
    message = message[sizes.end():] if sizes else message
    if "Status Message: " in message:
        message = message.split("Status Message: ", 1)[1]
        message = re.sub(r"^\S+\.(cc|h):\d+ (\S+ )?", "", message)
    return f"{message} (at {sizes.group(1)})" if sizes else message


def _short(text: str, limit: int = 110) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _export(model, inputs, outputs, exporter: str, patches: bool, seed: int):
    """Export through the pipeline's own exporter call, with or without the patches;
    returns the proto (or the exception), the outputs with their dims filled, the example sizes."""
    example = dim_sizes(inputs)
    args = tuple(make_inputs(inputs, example, seed=seed).values())
    with preserved(model):
        adapter = IOAdapter(model, forward_arguments(model, inputs), outputs)
        with torch.no_grad():
            outputs = check_outputs(flatten(adapter(*args)), outputs, example)
        try:
            proto, _ = exporters.run(exporter, adapter, args, inputs, outputs,
                                     patch_options=None if patches else {"only": []})
        except Exception as exc:
            return exc, outputs, example
    return proto, outputs, example


def vanilla_export(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                   exporter: str, seed: int = 0) -> Outcome:
    """Export with no patch and check the result; the model is left as it was."""
    proto, outputs, example = _export(model, inputs, outputs, exporter, patches=False, seed=seed)
    if isinstance(proto, Exception):
        return Outcome("export", _short(exporters.error_line(proto)))
    nodes = len(proto.graph.node)
    baked = graph.static_where_dynamic(proto, exporters.wanted_dynamic(list(inputs) + list(outputs)))
    if baked:
        return Outcome("dims", _short(baked[0]), nodes)
    try:
        verify(proto, model, inputs, outputs, example=example, seed=seed + 1)
    except VerificationError as exc:
        return Outcome(_stage(str(exc)), _short(_verification_detail(str(exc))), nodes)
    return Outcome("ok", nodes=nodes)


def export_proto(model, inputs, outputs, exporter: str, patches: bool = False, seed: int = 0) -> onnx.ModelProto:
    """The bare export, with or without the patches, for callers that compare graphs; raises on failure."""
    proto, _, _ = _export(model, inputs, outputs, exporter, patches, seed)
    if isinstance(proto, Exception):
        raise proto
    return proto
