"""Which of the user's modules is at fault: the export that fails, the numbers that differ, the dim baked in.

The pipeline says *what* went wrong ("max abs err 0.41 at B=1/T=23"); in a
400-module model the user needs *where*. ``diagnose`` exports the model with
one exporter (under the patches, as ``export`` does) and then:

* when the export fails: the module the failure points at (``culprit.py``);
* otherwise each module's output in ONNX Runtime against eager. The module
  outputs in the graph are found from the exporters' own scopes (TorchScript
  node names ``/blocks.0/attn/MatMul``, dynamo's ``pkg.torch.onnx.name_scopes``
  metadata): the values a module's nodes make that are read outside it. A copy
  of the graph exposes them as outputs; eager outputs come from forward hooks
  on the unpatched model. Modules are compared in the order their forwards
  return (children before their parent), so the first one that differs is
  where the difference starts; the ones that only inherit it come after.
* a module output whose dim follows the input in eager (it differs between two
  input sizes) but is a constant in the graph: the dim stopped being dynamic
  there. The dynamo exporter is let to specialise (``Dim.AUTO``) so the graph
  exists to look at.

The model is left as it was: hooks removed, flags and state restored, also on error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import onnx
import torch

from onnx_compat.diagnosis import scopes
from onnx_compat.diagnosis.culprit import culprit
from onnx_compat.errors import Culprit
from onnx_compat.model_state import preserved
from onnx_compat.pipeline import capture
from onnx_compat.pipeline.adapter import flatten
from onnx_compat.pipeline.subject import Subject, subject_of
from onnx_compat.runtimes.compare import closeness, magnitude
from onnx_compat.runtimes.session import open_session
from onnx_compat.spec import TensorSpec, example_sizes, make_inputs, verification_sizes

Finding = Culprit  # the name diagnose() results had before errors.Culprit


@dataclass
class Diagnosis:
    exporter: str
    findings: List[Culprit] = field(default_factory=list)
    compared: int = 0  # module outputs compared

    @property
    def culprit(self) -> Optional[Culprit]:
        return self.findings[0] if self.findings else None

    def summary(self) -> str:
        if not self.findings:
            return f"no fault found ({self.exporter}; {self.compared} module outputs agree with eager)"
        lines = [self.findings[0].line()]
        lines += [f"then     {f.module or '(the model itself)'} ({f.cls}): {f.detail}" for f in self.findings[1:]]
        return "\n".join(lines)


def module_values(proto: onnx.ModelProto, modules: Sequence[str]) -> Dict[str, List[str]]:
    """Per module path: the values its nodes make that are read outside it (its outputs), in graph order.

    ``modules``: the model's module paths (``named_modules()``), to resolve TorchScript's scope names.
    """
    known = set(modules)
    nodes = list(proto.graph.node)
    scope_of = [scopes.of_onnx_node(node, known) for node in nodes]  # by index: protobuf hands out a new wrapper on each access
    readers: Dict[str, List[Optional[str]]] = {}
    for node, scope in zip(nodes, scope_of):
        for name in node.input:
            readers.setdefault(name, []).append(scope)
    graph_outputs = {o.name for o in proto.graph.output}
    out: Dict[str, List[str]] = {}
    for node, scope in zip(nodes, scope_of):
        if scope is None:
            continue
        parts = scope.split(".") if scope else []
        for depth in range(len(parts) + 1):
            path = ".".join(parts[:depth]) if depth else ""
            for value in node.output:
                read_outside = value in graph_outputs or any(not _inside(r, path) for r in readers.get(value, ()))
                if value and read_outside and value not in out.setdefault(path, []):
                    out[path].append(value)
    return out


def _inside(scope: Optional[str], path: str) -> bool:
    return scope is not None and (not path or scope == path or scope.startswith(path + "."))


def _with_outputs(proto: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    have = {o.name for o in copy.graph.output}
    for name in names:
        if name not in have:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy


def _tensor(value):
    """The first floating tensor of a module's output."""
    for t in flatten(value) if isinstance(value, (tuple, list, dict, torch.Tensor)) else ():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    return None


def _eager_outputs(model: torch.nn.Module, adapter: torch.nn.Module, feeds) -> List[tuple]:
    """``(path, class, output tensor)`` per module in the order its forward returned."""
    names = {id(m): n for n, m in model.named_modules()}
    seen: List[tuple] = []

    def hook(module, args, output):
        t = _tensor(output)
        if t is not None:
            seen.append((names[id(module)], type(module).__name__, t.detach().cpu().numpy()))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            adapter(*(t.clone() for t in feeds.values()))  # its own copies: a model may write into its input
    finally:
        for h in handles:
            h.remove()
    return seen


def diagnose(model, inputs: Sequence[TensorSpec] = (), outputs: Sequence[TensorSpec] = (), *,
             exporter: str = "dynamo", examples=None, sizes=None, atol: float = 1e-4, rtol: float = 1e-3,
             seed: int = 0, patches: Optional[dict] = None) -> Diagnosis:
    """Find the module at fault when ``model`` does not export, or exports to other numbers or static dims.

    ``model`` may be a ``Subject`` (the pipeline's, already built). ``sizes``/``examples`` as in
    ``export``. A module's output differs when ``max|onnx - eager| > atol + rtol * max|eager|``.
    """
    subject = subject_of(model, inputs, outputs, examples=examples, sizes=sizes, seed=seed)
    result = Diagnosis(exporter)
    with preserved(subject.model):
        adapter = subject.adapter()
        try:
            proto, _ = capture.run(exporter, adapter, subject.args, subject.inputs, subject.outputs,
                                   patch_options=patches, let_dims_specialize=True)
        except Exception as exc:
            found = culprit(exc, subject.model)
            result.findings.append(found or Culprit("export", "", type(subject.model).__name__,
                                                    capture.error_line(exc)))
            return result
        _compare_modules(subject, adapter, proto, result, atol, rtol)
    return result


def _runs(subject: Subject) -> List[dict]:
    """The feeds compared: generated inputs at the verification sizes, then the user's examples."""
    sizes = verification_sizes(subject.inputs, subject.example)
    return [make_inputs(subject.inputs, s, subject.seed + 1 + k) for k, s in enumerate(sizes)] + list(subject.examples)


def _compare_modules(subject: Subject, adapter, proto, result: Diagnosis, atol: float, rtol: float) -> None:
    """Static dims first, then each module's outputs in ONNX Runtime against eager, in forward order."""
    model = subject.model
    values = module_values(proto, [n for n, _ in model.named_modules()])
    copy = _with_outputs(proto, sorted({v for vs in values.values() for v in vs}))
    runs = _runs(subject)
    result.findings += _static_dims(model, adapter, values, copy,
                                    make_inputs(subject.inputs, subject.example, subject.seed), runs[0])
    sess = open_session(copy)
    wanted = {i.name for i in sess.get_inputs()}
    numbers: Dict[str, Culprit] = {}
    for feeds in runs:
        sizes = dict(example_sizes(subject.inputs, feeds))
        try:
            got = dict(zip([o.name for o in sess.get_outputs()],
                           sess.run(None, {k: v.numpy() for k, v in feeds.items() if k in wanted})))
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's refusal names the node; that gives the module
            if not result.findings:
                result.findings.append(_run_failure(proto, model, exc, sizes))
            continue
        for path, cls, expected in _eager_outputs(model, adapter, feeds):
            result.compared += 1
            if path not in numbers:
                found = _differs(path, cls, expected, [got[v] for v in values.get(path, ()) if v in got], sizes,
                                 atol, rtol)
                if found is not None:
                    numbers[path] = found
    order = [p for p, _, _ in _eager_outputs(model, adapter, runs[0])]
    result.findings += sorted(numbers.values(), key=lambda f: order.index(f.module) if f.module in order else 1e9)


def _differs(path, cls, expected, candidates, sizes, atol, rtol) -> Optional[Culprit]:
    """A module output whose closest graph value is off by more than the tolerance."""
    candidates = [c for c in candidates if c.shape == expected.shape]
    if not candidates:
        return None
    # the runtime layer's rule (NaN/inf where eager has them), rtol of the module's whole output
    checks = [closeness(c, expected, atol, rtol, relative_to="largest") for c in candidates]
    if any(c.ok for c in checks):
        return None
    err, scale = min(c.max_abs_err for c in checks), magnitude(expected)
    return Culprit("numbers", path, cls, f"output differs from eager: max abs err {err:.3g} (scale {scale:.3g}) "
                   f"at sizes {sizes}")


_NODE = re.compile(r"node\. Name:'([^']+)'")


def _run_failure(proto, model, exc, sizes) -> Culprit:
    """ONNX Runtime failed at ``sizes``: the module of the node it names."""
    text = str(exc).splitlines()[0]
    found = _NODE.search(text)
    node = next((n for n in proto.graph.node if found and n.name == found.group(1)), None)
    modules = dict(model.named_modules())
    path = scopes.of_onnx_node(node, set(modules)) if node is not None else None
    what = text.split("Status Message: ")[-1]
    what = re.sub(r"^\S+:\d+ [^)]*\) ", "", what)  # ORT's source location
    if path is None or path not in modules:
        return Culprit("run", "", type(model).__name__, f"ONNX Runtime fails at sizes {sizes}: {what}")
    return Culprit("run", path, type(modules[path]).__name__, f"ONNX Runtime fails at sizes {sizes} in "
                   f"{found.group(1)}: {what}")


def _static_dims(model, adapter, values, copy, first, second) -> List[Culprit]:
    """Module outputs whose dim follows the input in eager but is a constant in the graph (shape inference)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
    except Exception:  # noqa: BLE001 - no shapes, no finding
        return []
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.output) if v.type.HasField("tensor_type")}
    a, b = _eager_outputs(model, adapter, first), _eager_outputs(model, adapter, second)
    found = []
    for (path, cls, x), (_, _, y) in zip(a, b):
        varying = [k for k in range(min(x.ndim, y.ndim)) if x.shape[k] != y.shape[k]]
        if not varying or x.ndim != y.ndim:
            continue
        for name in values.get(path, ()):
            dims = shapes.get(name)
            if dims is None or len(dims) != x.ndim or any(dims[k] not in (None, 0, x.shape[k]) for k in range(x.ndim)):
                continue  # not this output
            fixed = [k for k in varying if dims[k] == x.shape[k]]
            if fixed:
                found.append(Culprit("static dim", path, cls, f"output dim {fixed[0]} is fixed at {x.shape[fixed[0]]} "
                                     f"in the graph but follows the input in eager ({x.shape[fixed[0]]} vs "
                                     f"{y.shape[fixed[0]]})"))
                break
        if found:
            break
    return found
