"""Of several verified graphs of one model, the one that runs faster in ONNX Runtime.

Users export to run: once two exporters both give a graph that is proven
right, the one they get should be the one that costs them less at inference.
Node counts do not say which (a 1,132-node TorchScript graph of an attention
encoder ran in 0.88x the time of dynamo's 607 nodes), so the graphs are timed
on the inputs verification already made, in the same interleaved rounds so a
burst of load on a shared machine hits both alike. A session is built the way a
deployment builds it (full optimisation, prepacked weights, one thread): the
verification's own sessions are not, they skip prepacking to load quickly.
The first graph is the default and is kept unless another is faster by more
than ``margin``: a choice inside the noise would flip between runs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from onnx_compat.errors import ExportError
from onnx_compat.runtimes.session import ModelSource, open_session
from onnx_compat.spec import make_inputs, verification_sizes

GraphLike = ModelSource  # a ModelProto, serialized bytes, a path or a session


@dataclass
class Choice:
    """The graph chosen, each graph's median time over the cases, and each one's ratio to the chosen."""

    name: str
    seconds: Dict[str, float]
    ratios: Dict[str, float] = field(default_factory=dict)
    cost: float = 0.0  # seconds spent building sessions and timing

    def why(self) -> str:
        """One line for ``Report.why``."""
        others = [f"{k} {r:.2f}x" for k, r in self.ratios.items() if k != self.name]
        if not others:
            return f"{self.name}: the only verified graph"
        if min(self.ratios.values()) < 1.0:  # the first graph kept: the other's lead is inside the margin
            return (f"{self.name} kept: no other graph runs faster by more than the margin in ONNX Runtime "
                    f"({', '.join(others)} its time, 1 thread)")
        return f"{self.name} runs faster in ONNX Runtime ({', '.join(others)} its time, 1 thread)"


def deployed_session(graph: GraphLike, threads: int = 1):
    """A session as a deployment builds it: all optimisations on, weights prepacked, ``threads`` fixed (a
    session already open is used as it is)."""
    return open_session(graph, threads=threads, prepack=True, optimization="all")


def _feeds(case, wanted) -> Dict[str, np.ndarray]:
    """A verification ``Case`` (torch tensors in ``.feeds``) or a plain dict, as ONNX Runtime's feeds."""
    raw = getattr(case, "feeds", case)
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in raw.items() if k in wanted}


def _runner(name: str, sess, cases: Sequence) -> callable:
    wanted = {i.name for i in sess.get_inputs()}
    feeds = [_feeds(c, wanted) for c in cases]

    def run_all():
        for f in feeds:
            sess.run(None, f)
    try:
        run_all()  # warm-up; a graph that cannot run here is an error, not a slow contender
    except Exception as exc:
        raise ExportError(f"{name}: ONNX Runtime failed while timing the verified graphs: {exc}",
                          stage="choose") from exc
    return run_all


# What the other exporter is worth exporting for, once one exporter's graph is verified: an op in that graph
# whose rewrite ran much slower than the other exporter's in benchmarks/rewrite_latency.py (1 thread, CPU time;
# docs/benchmarks.md). A second export costs 5-10x more under dynamo than under TorchScript.
TRY_THE_OTHER = {
    "torchscript": {"Loop": "ONNX Loop (LSTMP, length regulator) took 2.2-10.7x dynamo's graph"},
    "dynamo": {"Resize": "antialiased Resize took 2.16x TorchScript's two MatMuls"},
}
# ... or a graph that is half shape bookkeeping or more: nodes whose value depends only on the inputs' shapes and
# is an integer or a boolean (Shape, the Gather/Unsqueeze/Concat of a size read with int(), pad arithmetic), each
# a kernel call of microseconds that TorchScript's graph runs on every call where dynamo folds a static dim or
# writes one symbolic expression. Measured in benchmarks/choose_rule.py (docs/benchmarks.md, 1 thread, median of
# 3 passes): the four graphs without a Loop where dynamo's took under 0.90x TorchScript's time are 53-90%
# bookkeeping (MobileNetV2 tf_padding 0.74x, CLAP 0.88x, the unfold and 1-d adaptive average pooling
# rewrites 0.70-0.74x); the other four at or above half took 0.96-1.02x (the second export is then wasted, not harmful).
# Below half dynamo's took 0.96-2.20x but for one 50-microsecond rewrite (floor_divide, 7%: 0.88x); the
# transformers models whose export must stay within optimum's time (issue #29 item 3: wav2vec2, HuBERT, WavLM
# CTC, Whisper encoder, AST) are 29-43% even at the base models' depth, so they keep one export.
BOOKKEEPING_SHARE = {
    "torchscript": (0.5, "at half or more dynamo's graph took 0.70-0.88x TorchScript's time (MobileNetV2 "
                         "tf_padding, CLAP, unfold, 1-d adaptive average pooling), 0.96-1.02x on the others"),
}


def _slow_op(proto: onnx.ModelProto, exporter: str) -> Optional[str]:
    slow = TRY_THE_OTHER.get(exporter, {})
    found = next((n.op_type for n in proto.graph.node if n.op_type in slow), None)
    return f"{found}: {slow[found]}" if found else None


def _bookkept(proto: onnx.ModelProto, exporter: str) -> Optional[str]:
    if exporter not in BOOKKEEPING_SHARE:
        return None
    threshold, reason = BOOKKEEPING_SHARE[exporter]
    share = bookkeeping_share(proto)
    return f"shape bookkeeping {share:.0%} of the nodes: {reason}" if share >= threshold else None


def worth_timing(proto: onnx.ModelProto, exporter: str) -> Optional[str]:
    """Why the other exporter's graph may run faster than ``proto`` (``exporter``'s), or None: then the
    verified graph is kept without a second export."""
    return next((why for why in (rule(proto, exporter) for rule in (_slow_op, _bookkept)) if why), None)


# the element type an op gives, where it is not its first typed input's: comparisons give booleans ...
_BOOL_OPS = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN",
             "IsInf"}
_INT64_OPS = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin"}
_ATTRIBUTE_TYPES = {"value_int": onnx.TensorProto.INT64, "value_ints": onnx.TensorProto.INT64,
                    "value_float": onnx.TensorProto.FLOAT, "value_floats": onnx.TensorProto.FLOAT,
                    "value_string": onnx.TensorProto.STRING, "value_strings": onnx.TensorProto.STRING}
_INTEGER_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
                  onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16,
                  onnx.TensorProto.UINT8, onnx.TensorProto.BOOL}


def _element_type(node: onnx.NodeProto, types: Mapping[str, int]) -> int:
    """The element type of ``node``'s first output from its inputs' (0: unknown)."""
    if node.op_type in _INT64_OPS:
        return onnx.TensorProto.INT64
    if node.op_type in _BOOL_OPS:
        return onnx.TensorProto.BOOL
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Cast":
        return attrs["to"].i
    if "value" in attrs and node.op_type in ("Constant", "ConstantOfShape"):
        return attrs["value"].t.data_type
    if node.op_type == "Constant":  # value_int(s), value_float(s), value_string(s)
        return next((_ATTRIBUTE_TYPES[a] for a in attrs if a in _ATTRIBUTE_TYPES), 0)
    if node.op_type == "ConstantOfShape":
        return onnx.TensorProto.FLOAT
    inputs = node.input[1:] if node.op_type == "Where" else node.input
    return next((types[i] for i in inputs if types.get(i)), 0)


def bookkeeping_share(proto: onnx.ModelProto) -> float:
    """The share of the graph's nodes (``Constant`` aside: ONNX Runtime loads it as a weight) that compute
    integers or booleans from the inputs' shapes alone, never from their values. Tables a rewrite builds from
    the shapes (an antialiased resize's float weights) are the model's work, not bookkeeping."""
    types = {t.name: t.data_type for t in proto.graph.initializer}
    from_values = {i.name for i in proto.graph.input if i.name not in types}
    counted = bookkeeping = 0
    for node in proto.graph.node:
        if node.op_type == "Constant":
            types[node.output[0]] = _element_type(node, types)
            continue
        counted += 1
        if node.op_type not in ("Shape", "Size") and any(i in from_values for i in node.input if i):
            from_values.update(node.output)
            continue
        types.update((o, _element_type(node, types)) for o in node.output)
        bookkeeping += types[node.output[0]] in _INTEGER_TYPES
    return bookkeeping / counted if counted else 0.0


def verification_feeds(subject) -> List[Dict[str, np.ndarray]]:
    """The inputs verification runs (its sizes and seeds, ``reference_cases``), without the eager reference:
    timing needs only the feeds, so a graph verified without them (dynamo, no cleanup) costs no eager run."""
    sizes = verification_sizes(subject.inputs, subject.example)
    seed = subject.seed + 1  # as ``stages._verified`` passes it
    return [{name: t.numpy() for name, t in make_inputs(subject.inputs, s, seed=seed + i).items()}
            for i, s in enumerate(sizes)]


def faster(graphs: Mapping[str, GraphLike], cases: Sequence, rounds: int = 5, margin: float = 1.05,
           threads: int = 1) -> Choice:
    """Time every graph on every case (``rounds`` interleaved rounds, median) and choose.

    ``graphs``: name -> ModelProto, serialized bytes, path or session, in order of preference.
    ``cases``: the verification inputs (``verification.Case`` or ``{onnx_name: array}``)."""
    if not graphs:
        raise ValueError("faster() needs at least one graph")
    t0 = time.perf_counter()
    names = list(graphs)
    if len(names) == 1:
        return Choice(names[0], {}, {names[0]: 1.0})
    runners = {k: _runner(k, deployed_session(g, threads), cases) for k, g in graphs.items()}
    times: Dict[str, List[float]] = {k: [] for k in names}
    # one thread: ONNX Runtime computes in this thread, whose CPU time is the graph's cost whatever else runs on
    # the machine (wall time under load flipped a choice: CLAP's dynamo graph timed 2.79x TorchScript's beside
    # another export, 0.88x on an idle machine); more threads: wall time, which is what they save
    clock = time.thread_time if threads == 1 else time.perf_counter
    for _ in range(rounds):
        for k in names:
            t = clock()
            runners[k]()
            times[k].append(clock() - t)
    seconds = {k: statistics.median(v) for k, v in times.items()}
    best = min(names, key=seconds.get)
    chosen = best if seconds[names[0]] > margin * seconds[best] else names[0]
    ratios = {k: seconds[k] / seconds[chosen] for k in names}
    return Choice(chosen, seconds, ratios, time.perf_counter() - t0)
