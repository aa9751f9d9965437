"""When a recipe misses its threshold: find the nodes that add the most error and keep them in float.

Per-node activation error as ONNX Runtime's QDQ debugging tools compute it
(``onnxruntime.quantization.qdq_loss_debug``): both graphs run with every
float tensor made an output (``modify_model_output_intermediate_tensors``,
``collect_activations``), each tensor of the quantized graph is compared with
the float graph's by ``compute_signal_to_quantization_noice_ratio`` (dB; after
its DequantizeLinear in a QDQ graph, as ``create_activation_matching`` pairs
them), and a node is ranked by the noise power at its output minus the
largest at its inputs: the error it adds, not the error it inherits.

(A ranking by ``compute_activation_error``'s ``qdq_err``, each tensor's own
QDQ noise, was tried on the bundled Conformer's ``int8-static-all``: with 45
nodes excluded its greedy-CTC agreement was still 0, where this ranking
brought it to its threshold, an SNR of 14.5 dB remaining short of 20.)

The worst are excluded (``nodes_to_exclude`` / ``node_block_list``), the model
is made and verified again and the ranking redone on it; the count of nodes
out roughly doubles each round, up to ``limit``, and once a round passes, a
bisection finds the shortest worst-first prefix that still does.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import onnx
from onnx.helper import tensor_dtype_to_np_dtype
from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors
from onnxruntime.quantization.quant_utils import DEQUANT_OUTPUT_SUFFIX

from .calibration import FeedsReader
from .measures import snr_db


@dataclass
class Culprit:
    nodes: List[str]  # float-graph nodes excluded together
    op_types: List[str]
    where: str  # the node whose output the error was measured at
    added_noise: float  # noise power / signal power added there (0: none)
    snr_db: float  # the error there, as ONNX Runtime's tools give it

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def activations(path: str, feeds: Sequence[Dict[str, np.ndarray]], workdir: str, tag: str) -> Dict[str, list]:
    """Every float tensor of the model at ``path`` on each feed (ONNX Runtime's own collection)."""
    augmented = os.path.join(workdir, f"{tag}.augmented.onnx")
    modify_model_output_intermediate_tensors(path, augmented)
    types = {i.name: tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
             for i in onnx.load(path, load_external_data=False).graph.input}
    cast = [{k: v.astype(types.get(k, v.dtype), copy=False) for k, v in f.items()} for f in feeds]
    try:
        return collect_activations(augmented, FeedsReader(cast))
    finally:
        os.unlink(augmented)


def _noise(snr_db: float) -> float:
    return 10.0 ** (-snr_db / 10.0) if math.isfinite(snr_db) else (math.inf if snr_db < 0 else 0.0)


def _wanted(node: onnx.NodeProto, op_types, skip) -> bool:
    return bool(node.name) and node.name not in skip and (not op_types or node.op_type in op_types)


class AddedNoise:
    """Graphs without QDQ pairs: each node by the noise at its output beyond its worst input's."""

    def rank(self, float_model, reference, quantized_acts, op_types, skip) -> List[Culprit]:
        found = []
        for node in float_model.graph.node:
            outs = [(o, quantized_acts.get(o + DEQUANT_OUTPUT_SUFFIX, quantized_acts.get(o)))
                    for o in node.output if o in reference]
            outs = [(o, q) for o, q in outs if q is not None]
            if not outs or not _wanted(node, op_types, skip):
                continue
            out_db = min(snr_db(reference[o], q) for o, q in outs)
            in_db = min((snr_db(reference[i], quantized_acts[i]) for i in node.input
                         if i in reference and i in quantized_acts), default=math.inf)
            found.append(Culprit([node.name], [node.op_type], node.name, _noise(out_db) - _noise(in_db), out_db))
        return found




def rank(float_path: str, quant_path: str, feeds, op_types, skip: Sequence[str], workdir: str) -> List[Culprit]:
    """Candidates (nodes of ``op_types``; any when None) grouped as they must be excluded, worst first."""
    reference = activations(float_path, feeds, workdir, "float")
    quantized_acts = activations(quant_path, feeds, workdir, "quantized")
    float_model = onnx.load(float_path, load_external_data=False)
    changed = _changed(float_model, onnx.load(quant_path, load_external_data=False))
    skip = set(skip) | {n.name for n in float_model.graph.node if changed and n.name not in changed}
    found = AddedNoise().rank(float_model, reference, quantized_acts, op_types, skip)
    return sorted((c for c in found if c.added_noise > 0), key=lambda c: -c.added_noise)


def _changed(float_model: onnx.ModelProto, quantized: onnx.ModelProto) -> set:
    """Float nodes the recipe replaced or rewired (int8 recipes); empty when every node is kept as it was
    in name and inputs (float16 changes types only: then every node is a candidate)."""
    kept = {(n.name, n.op_type, tuple(n.input)) for n in quantized.graph.node}
    return {n.name for n in float_model.graph.node if (n.name, n.op_type, tuple(n.input)) not in kept}


def exclude_until_met(make: Callable[[Sequence[str]], None], check: Callable[[], object], result, float_path: str,
                      quant_path: str, feeds, op_types, workdir: str, limit: int) -> Tuple[object, List[Culprit]]:
    """Exclude the worst nodes until ``check()`` passes or ``limit`` nodes are out; ``make(names)``
    rewrites ``quant_path`` with those nodes excluded, ``result`` is the check of it with none. Returns the
    last result and what was excluded: the shortest worst-first prefix that passes (bisection)."""
    excluded: List[Culprit] = []
    names: List[str] = []
    passed_without = 0  # culprits known to be too few
    while not result.ok and len(names) < limit:
        ranked = rank(float_path, quant_path, feeds, op_types, names, workdir)
        taken = _next_round(ranked, len(names), limit)
        if not taken:
            break
        passed_without = len(excluded)
        excluded += taken
        names = _names(excluded)
        make(names)
        result = check()
    if result.ok and len(excluded) - passed_without > 1:
        excluded, result = _shortest(make, check, excluded, passed_without, result)
    return result, excluded


def _next_round(ranked: List[Culprit], out: int, limit: int) -> List[Culprit]:
    """About as many more culprits as are out already (1, 1, 2, 4, ...), within ``limit`` nodes."""
    taken, count = [], out
    for culprit in ranked:
        if len(taken) >= max(1, out) or count + len(culprit.nodes) > limit:
            break
        taken.append(culprit)
        count += len(culprit.nodes)
    return taken


def _names(culprits: Sequence[Culprit]) -> List[str]:
    names: List[str] = []
    for c in culprits:
        names += [n for n in c.nodes if n not in names]
    return names


def _shortest(make, check, excluded: List[Culprit], low: int, result) -> Tuple[List[Culprit], object]:
    """The fewest culprits (a prefix of ``excluded``, longer than ``low``) that still pass."""
    high, best = len(excluded), result
    while high - low > 1:
        middle = (low + high) // 2
        make(_names(excluded[:middle]))
        trial = check()
        if trial.ok:
            high, best = middle, trial
        else:
            low = middle
    make(_names(excluded[:high]))  # the file on disk is the model reported
    return excluded[:high], best
