"""Where in the user's model a failed export happened, found again after the failure.

The TorchScript exporter names the op it could not convert but not its node;
the dynamo exporter names an FX node of a program it does not hand back. Both
are found by tracing once more, only on failure, so a successful export pays
nothing. What is found travels on ``CaptureError`` as fields (``scope``,
``node``) to ``diagnosis.culprit``.
"""
from __future__ import annotations

import re
import warnings
from typing import Dict, Optional, Tuple

import torch

from onnx_compat.patches import when
from onnx_compat.pipeline.dims import cause_text


_FAILED_OP = re.compile(r"operator '(\w+::\w+)'")


def torchscript_scope(exc: BaseException, model, args) -> Optional[Tuple[str, str]]:
    """An op the TorchScript exporter cannot convert is named, its node is not: trace again (only now,
    on failure, with the same patches acting): the first such node's scope and source."""
    found = _FAILED_OP.search(str(exc))
    if not found or "scope:" in str(exc):  # the error quotes the node's scope itself
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            when.request_trace(+1)
            try:
                traced = torch.jit.trace(model, args, check_trace=False, strict=False)
            finally:
                when.request_trace(-1)
        node = next((n for n in traced.inlined_graph.nodes() if n.kind() == found.group(1)), None)
    except Exception:  # diagnosis never hides the exporter's own error
        return None
    if node is None:
        return None
    return node.scopeName(), str(node.sourceRange()).splitlines()[0] if node.sourceRange() else ""


_FAILED_NODE = re.compile(r"Error when translating node %(\w+)")


def dynamo_node(exc: BaseException, model, args, dynamic_shapes) -> Optional[Dict[str, object]]:
    """A translation failure names an FX node of a program torch.onnx does not hand back: export it
    again (only now, on failure): that node's module stack and source, for ``culprit``."""
    found = _FAILED_NODE.search(cause_text(exc))
    if not found:
        return None
    program = translated_program(exc)
    if program is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
                program = program.run_decompositions()
        except Exception:  # diagnosis never hides the exporter's own error
            return None
    nodes = {node.name: node for node in program.graph.nodes}
    name = found.group(1)
    node = nodes.get(name) or next((n for key, n in nodes.items() if key.split("_default")[0] == name.rstrip("_0123456789")
                                    or name.startswith(key)), None)
    if node is None:
        return None
    return {"nn_module_stack": node.meta.get("nn_module_stack"), "stack_trace": node.meta.get("stack_trace")}


def translated_program(exc: BaseException):
    """The decomposed program torch.onnx was translating when it failed, still held by its own frame on
    the error's traceback: the node the error names is one of its nodes. Exporting again to find it cost as
    much as the failed export itself (the ISTFT vocoder: 25 s of CPU of its 48, torch.export and the
    decomposition of istft run twice); None when the failure came before that program existed."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            program = tb.tb_frame.f_locals.get("decomposed_program")
            if isinstance(program, torch.export.ExportedProgram):
                return program
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return None
