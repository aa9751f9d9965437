"""The verification copy of a graph that draws: each random node fed the eager reference run's own draw.

A model that makes its own noise (a GAN vocoder's ``torch.randn([B, C, T])``, a VAE's or a sampler's) is
exported with its random nodes: that is the graph a user wants. No run of it can match an eager run that
draws again, so verification runs a COPY in which each random node's output is replaced by a new graph
input, fed with the draw the eager reference made at the same place (``random_draws.Recorder``, call
order). Everything downstream of the draw is then compared as for any model, at sizes the export never
saw, so a graph that is wrong anywhere else still fails. The written graph is never this copy.

The match is explicit and refused when it does not hold (``DrawsDiffer``, a verification failure of
kind "draws"): as many random nodes in the graph as draws in the eager call, in the same order; the same
kind (normal or uniform); and the same shape, which the copy checks by keeping each random node, its output
renamed and exposed as an output, so the number of values it draws at each size is seen (a ``RandomNormal``
with the example's shape frozen in fails there). Parameters may differ: the TorchScript exporter writes
``normal_(0.5, 2.0)`` as a standard ``RandomNormalLike`` followed by ``* 2 + 0.5``; the eager draw is then
standardised and mapped into the node's own distribution (``x -> m + s * (d - mean) / std``; the bounds
for uniform numbers), which is the very number that node would have to draw for the graph to compute what
eager did, so a graph that forgets the scaling still fails (an integer draw k of ``randint`` is fed as
k + 0.5, the middle of the numbers the graph must round down to k). Nodes and draws pair up in the export's order,
which is the model's call order (a TorchScript trace and an FX graph list the calls as they ran); ONNX
Runtime's cleanup sorts independent nodes its own way, so the pipeline puts them back in the export's
order (``in_call_order``), in the file written too. A graph whose nodes do not pair up that way fails: a
refusal, never a silent pass.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import helper

from onnx_compat.errors import DrawsDiffer  # in the one family; importable from here as before
from onnx_compat.graph import nested_nodes, subgraphs

KINDS = {"RandomNormal": "normal", "RandomNormalLike": "normal",
         "RandomUniform": "uniform", "RandomUniformLike": "uniform"}
_UNFED = ("Bernoulli", "Multinomial")  # random nodes no eager draw is fed to
_PARAMS = {"normal": ("mean", "scale", 0.0, 1.0), "uniform": ("low", "high", 0.0, 1.0)}
EXPOSED = "__onnx_compat_drawn"  # suffix of the renamed output of a random node in the copy


@dataclass
class RandomNode:
    """One random node of the main graph, in graph order: its output (a graph input in the copy)."""

    name: str
    op: str
    output: str
    kind: str
    a: float  # mean or low
    b: float  # scale or high
    dtype: Optional[int]  # the ``dtype`` attribute, when the node has one

    def describe(self) -> str:
        return f"{self.op} {self.name or self.output!r}"


def in_call_order(cleaned: onnx.ModelProto, exported: onnx.ModelProto) -> bool:
    """The random nodes of ``cleaned`` put back in the order they have in ``exported``, the model's call order
    (a TorchScript trace and an FX graph list the calls as they ran; ONNX Runtime's cleanup sorts
    independent nodes its own way). The nodes are sorted again topologically, each known node at its
    place in the export and every other one as soon as its inputs are there, so the graph computes the
    same. Whether anything moved."""
    before = [n.name for n in exported.graph.node if n.op_type in KINDS]
    now = [n.name for n in cleaned.graph.node if n.op_type in KINDS]
    if len(now) < 2 or [name for name in before if name in now] == now:
        return False
    place = {n.name: k for k, n in enumerate(exported.graph.node) if n.name}
    nodes = _sorted(list(cleaned.graph.node), lambda node: place.get(node.name, -1))
    if nodes is None:
        return False
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del cleaned.graph.node[:]
    cleaned.graph.node.extend(copies)
    return True


def _sorted(nodes: List[onnx.NodeProto], priority: Callable) -> Optional[List[onnx.NodeProto]]:
    """``nodes`` in a topological order that takes the ready node of lowest ``priority`` first (Kahn's
    algorithm); None on a cycle. A node's inputs include the outer names its subgraphs read."""
    produced = {name: k for k, node in enumerate(nodes) for name in node.output if name}
    users: List[List[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for k, node in enumerate(nodes):
        for j in {produced[name] for name in _reads(node) if name in produced and produced[name] != k}:
            users[j].append(k)
            waiting[k] += 1
    ready = [(priority(node), k) for k, node in enumerate(nodes) if not waiting[k]]
    heapq.heapify(ready)
    order: List[int] = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for user in users[k]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (priority(nodes[user]), user))
    return [nodes[k] for k in order] if len(order) == len(nodes) else None


def _reads(node: onnx.NodeProto):
    yield from node.input
    for sub in subgraphs(node):
        for inner in sub.node:
            yield from _reads(inner)


def random_nodes(proto: onnx.ModelProto) -> List[RandomNode]:
    """The main graph's random nodes in graph order (``in_call_order``: the model's call order). A random
    node inside a subgraph (a ``Loop`` draws at every iteration) or a function, or a node no eager draw can
    be fed to, is refused: ``DrawsDiffer``."""
    nested = [n for n in nested_nodes(proto) if n.op_type in KINDS or n.op_type in _UNFED]
    if nested:
        raise DrawsDiffer(f"the graph draws inside a loop, branch or function ({nested[0].op_type} "
                          f"{nested[0].name!r}), where eager's draws cannot be fed to it")
    unfed = [n for n in proto.graph.node if n.op_type in _UNFED]
    if unfed:
        raise DrawsDiffer(f"the graph holds a {unfed[0].op_type} node ({unfed[0].name!r}), whose draws no eager "
                          f"draw can stand in for")
    found = []
    for node in proto.graph.node:
        if node.op_type in KINDS:
            kind = KINDS[node.op_type]
            first, second, a, b = _PARAMS[kind]
            attrs = {att.name: helper.get_attribute_value(att) for att in node.attribute}
            found.append(RandomNode(node.name, node.op_type, node.output[0], kind, float(attrs.get(first, a)),
                                    float(attrs.get(second, b)), attrs.get("dtype")))
    return found


def verification_copy(proto: onnx.ModelProto, nodes: Sequence[RandomNode], draws) -> onnx.ModelProto:
    """``proto`` with each random node's output renamed and exposed as an output, and its old name a new
    graph input of the eager draw's dtype (``draws``: one eager call's, matched to ``nodes`` already)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    by_output = {n.output: n for n in nodes}
    for node in copy.graph.node:
        if node.op_type in KINDS and node.output[0] in by_output:
            node.output[0] += EXPOSED
            copy.graph.output.append(helper.make_empty_tensor_value_info(node.output[0]))
    for node, draw in zip(nodes, draws):
        copy.graph.input.append(helper.make_tensor_value_info(node.output, _fed_type(node, draw), None))
    kept = [v for v in copy.graph.value_info if v.name not in by_output]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept)
    return copy


def check_match(nodes: Sequence[RandomNode], draws, sizes: Dict[str, int]) -> None:
    """The eager call's draws and the graph's random nodes pair up in order, kind by kind; else
    ``DrawsDiffer`` naming the first that does not."""
    unmatched = [d.site for d in draws if not d.kind]
    if unmatched:
        raise DrawsDiffer(f"at sizes {sizes} the model draws what no ONNX random node draws ({unmatched[0]})")
    if len(draws) != len(nodes):
        raise DrawsDiffer(f"at sizes {sizes} the model drew {len(draws)} times ({_sites(draws)}) but the graph "
                          f"has {len(nodes)} random nodes ({', '.join(n.describe() for n in nodes)})")
    for k, (node, draw) in enumerate(zip(nodes, draws)):
        if node.kind != draw.kind:
            raise DrawsDiffer(f"draw {k + 1} of the model ({draw.site}) is {draw.kind} but the graph's random "
                              f"node {k + 1} ({node.describe()}) draws {node.kind} numbers")
        if node.dtype is not None and node.dtype != _fed_type(node, draw):
            raise DrawsDiffer(f"draw {k + 1} of the model ({draw.site}) is {draw.value.dtype} but the graph's random "
                              f"node {k + 1} ({node.describe()}) draws {onnx.TensorProto.DataType.Name(node.dtype)}")
        if (draw.b == draw.a) if draw.kind == "uniform" else (draw.b == 0):
            raise DrawsDiffer(f"draw {k + 1} of the model ({draw.site}) is a constant (no spread), which cannot be "
                              f"mapped onto the graph's random node")


def _fed_type(node: RandomNode, draw) -> int:
    """The ONNX type of what ``node`` draws: the eager draw's, or for an integer draw (``randint``: a uniform
    draw the graph rounds down) the node's own, float unless its ``dtype`` says otherwise."""
    if not draw.integer:
        return helper.np_dtype_to_tensor_dtype(draw.value.numpy().dtype)
    return node.dtype if node.dtype is not None else onnx.TensorProto.FLOAT


def feeds(nodes: Sequence[RandomNode], draws) -> Dict[str, np.ndarray]:
    """Each node's input in the copy: the eager draw, mapped into the node's own distribution when the
    parameters differ (exactly the draw when they agree). An integer draw k of ``randint`` stands for the
    uniform numbers in [k, k + 1) that round down to it: the middle, k + 0.5, is mapped, so a graph that
    rounds another way (TorchScript truncates toward zero: -0.5 gives 0, not -1) fails."""
    fed = {}
    for node, draw in zip(nodes, draws):
        value = draw.value.numpy()
        if draw.integer:
            dtype = helper.tensor_dtype_to_np_dtype(_fed_type(node, draw))
            value = value.astype(np.float64) + 0.5
        else:
            dtype = value.dtype
        if (node.a, node.b) != (draw.a, draw.b):
            if node.kind == "normal":
                unit = (value.astype(np.float64) - draw.a) / draw.b
                value = node.a + node.b * unit
            else:
                unit = (value.astype(np.float64) - draw.a) / (draw.b - draw.a)
                value = node.a + (node.b - node.a) * unit
        fed[node.output] = np.asarray(value).astype(dtype)
    return fed


def check_shapes(nodes: Sequence[RandomNode], draws, by_name: Dict[str, np.ndarray], sizes: Dict[str, int]) -> None:
    """Each random node, run at these sizes, draws as many values in the same shape as its eager draw."""
    for k, (node, draw) in enumerate(zip(nodes, draws)):
        drawn = by_name.get(node.output + EXPOSED)
        if drawn is None or list(drawn.shape) != list(draw.value.shape):
            raise DrawsDiffer(f"at sizes {sizes} the graph's random node {k + 1} ({node.describe()}) draws shape "
                              f"{None if drawn is None else list(drawn.shape)} but the model drew "
                              f"{list(draw.value.shape)} ({draw.site})")


def _sites(draws) -> str:
    return "; ".join(dict.fromkeys(d.site for d in draws)) or "no draw"


Runner = Callable[[Dict[str, np.ndarray]], Dict[str, np.ndarray]]


@dataclass
class Substitution:
    """The verification copy of a graph with random nodes (``model``: a proto, or a path beside the graph's
    weights, removed by ``close``) and how each case's eager draws are fed to it."""

    nodes: List[RandomNode]
    model: Union[str, onnx.ModelProto]
    written: List[str] = field(default_factory=list)
    unused: List[str] = field(default_factory=list)  # eager draws no output depends on (no node fed)

    def runner(self, run: Runner, case) -> Runner:
        """``run`` (the copy's session) with the case's draws fed and their match and shapes checked."""
        def with_draws(fed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
            check_match(self.nodes, case.draws, case.sizes)
            by_name = run({**fed, **feeds(self.nodes, case.draws)})
            check_shapes(self.nodes, case.draws, by_name, case.sizes)
            return by_name
        return with_draws

    def described(self, case) -> List[str]:
        """Which eager draw each random node was fed, for the report."""
        fed = [f"{node.describe()} <- {draw.site}" for node, draw in zip(self.nodes, case.draws)]
        return fed + [f"unused by the outputs, no node: {site}" for site in self.unused]

    def close(self) -> None:
        for path in self.written:
            if os.path.exists(path):
                os.remove(path)


def substitution(onnx_model, serialized: Optional[bytes], cases, live: Callable) -> Optional[Substitution]:
    """The copy that takes eager's draws, when a case drew and the graph has random nodes; None otherwise
    (a model whose outputs do not depend on its draws is verified as it is). A case that drew more often
    than the graph has random nodes keeps only the draws its outputs depend on (``live(case)``: a draw
    overwritten before use, which the exporter drops; named in ``unused``). ``DrawsDiffer`` when the
    graph's draws cannot take eager's (``random_nodes``, ``check_match`` on the first case that drew)."""
    drawn = next((c for c in cases if c.draws), None)
    if drawn is None:
        return None
    path = None
    if isinstance(onnx_model, onnx.ModelProto):
        proto = onnx_model
    elif serialized is not None:
        proto = onnx.load_from_string(serialized)
    else:  # a graph beside its weights: the copy goes beside them too, and refers to the same files
        path = os.fspath(onnx_model)
        proto = onnx.load(path, load_external_data=False)
    nodes = random_nodes(proto)
    if not nodes:
        return None
    unused = _drop_unused(cases, len(nodes), live)
    check_match(nodes, drawn.draws, drawn.sizes)
    copy = verification_copy(proto, nodes, drawn.draws)
    if path is None:
        return Substitution(nodes, copy, unused=unused)
    copied = os.path.splitext(path)[0] + ".draws_fed.onnx"
    onnx.save(copy, copied)
    return Substitution(nodes, copied, [copied], unused)


def _drop_unused(cases, count: int, live: Callable) -> List[str]:
    """Each case that drew more than ``count`` times keeps only its live draws; the sites dropped."""
    dropped: List[str] = []
    for case in cases:
        if len(case.draws) > count and all(d.kind for d in case.draws):
            keep = live(case)
            dropped += [d.site for d, k in zip(case.draws, keep) if not k and d.site not in dropped]
            case.draws = [d for d, k in zip(case.draws, keep) if k]
    return dropped
