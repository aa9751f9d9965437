"""What plain ``torch.onnx.export`` does with a model: the baseline we compare against.

The same specs, names and dynamic dims as the pipeline, but no patches and no
cleanup, then the same checks (dims, load, ONNX Runtime against eager at new
shapes). The answer is one line a table can hold.
"""
from __future__ import annotations

import contextlib
import io
import re
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import onnx
import torch

from onnx_compat import graph
from onnx_compat.model_state import preserved
from onnx_compat.pipeline import capture, dims
from onnx_compat.pipeline.subject import Subject
from onnx_compat.pipeline.verification import VerificationError, verify
from onnx_compat.spec import TensorSpec


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


def _stage(exc: VerificationError) -> str:
    kind = exc.mismatch.kind if exc.mismatch is not None else "values"
    return {"load": "load", "run": "run"}.get(kind, "numbers")


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
    """Export through the pipeline's own capture, with or without the patches; returns the proto
    (or the exception), the outputs with their dims filled, the example sizes."""
    subject = Subject.build(model, inputs, outputs, seed=seed)
    with preserved(model):
        subject.check_outputs()
        try:
            proto, _ = capture.run(exporter, subject.adapter(), subject.args, subject.inputs, subject.outputs,
                                   patch_options=None if patches else {"only": []})
        except Exception as exc:
            return exc, subject.outputs, subject.example
    return proto, subject.outputs, subject.example


def vanilla_export(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                   exporter: str, seed: int = 0) -> Outcome:
    """Export with no patch and check the result; the model is left as it was."""
    proto, outputs, example = _export(model, inputs, outputs, exporter, patches=False, seed=seed)
    if isinstance(proto, Exception):
        return Outcome("export", _short(capture.error_line(proto)))
    nodes = len(proto.graph.node)
    baked = graph.static_where_dynamic(proto, dims.wanted_dynamic(list(inputs) + list(outputs)))
    if baked:
        return Outcome("dims", _short(baked[0]), nodes)
    try:
        verify(proto, model, inputs, outputs, example=example, seed=seed + 1)
    except VerificationError as exc:
        return Outcome(_stage(exc), _short(_verification_detail(str(exc))), nodes)
    return Outcome("ok", nodes=nodes)


def export_proto(model, inputs, outputs, exporter: str, patches: bool = False, seed: int = 0) -> onnx.ModelProto:
    """The bare export, with or without the patches, for callers that compare graphs; raises on failure."""
    proto, _, _ = _export(model, inputs, outputs, exporter, patches, seed)
    if isinstance(proto, Exception):
        raise proto
    return proto


def plain_export(model: torch.nn.Module, args: Tuple, exporter: str, input_names: Sequence[str],
                dynamic_axes: Dict[str, Dict[int, str]], output_names: Optional[Sequence[str]] = None,
                max_size: Optional[int] = 4096, path: Optional[str] = None) -> Optional[onnx.ModelProto]:
    """Plain ``torch.onnx.export`` to a ModelProto, quietly: what a user's own call does, without specs.

    ``path``: written there instead (weights past 2 GB beside it, as the exporter decides); returns None.

    No specs, no checks; the patches are whatever the caller has in place. For the
    tests and benchmarks that compare against (or time) the exporter itself.
    ``dynamic_axes``: ``{input_name: {axis: dim_name}}``; same name, same dim.
    """
    with preserved(model), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), capture._quiet_logs():
        model.eval()
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = path or io.BytesIO()
            torch.onnx.export(model, tuple(args), buf, input_names=list(input_names), output_names=output_names,
                              dynamic_axes={k: v for k, v in dynamic_axes.items() if v}, **capture._TORCHSCRIPT)
            return None if path else onnx.load_from_string(buf.getvalue())
        dims: Dict[str, object] = {}
        shapes = tuple({a: dims.setdefault(n, torch.export.Dim(n, min=1, **({"max": max_size} if max_size else {})))
                        for a, n in dynamic_axes.get(name, {}).items()} or None for name in input_names)
        program = torch.onnx.export(model, tuple(args), dynamo=True, dynamic_shapes=shapes,
                                    input_names=list(input_names), output_names=output_names, verbose=False)
        if path:
            program.save(path)
            return None
        return program.model_proto
