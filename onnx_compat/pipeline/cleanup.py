"""Graph cleanup with ONNX Runtime's own offline optimiser, at its basic level.

The TorchScript exporter leaves constant shape arithmetic that the dynamo
exporter folds itself; an asymmetric ``F.pad`` becomes a ~17-node subgraph
around one ``Pad``. ONNX Runtime's basic graph transformations (constant
folding, redundant-node elimination, ``Pad`` fused into ``Conv``) do that in
C++ and write standard ONNX ops only: the result stays portable. They ran
where onnxscript's optimizer and rewriter did (issue #15, 12 x 256
Conformer: 0.5 s instead of 2.0 s, 1338 nodes instead of 1388; the tiny
Conformer 270 instead of 278; the demo's hard conv stack 67 -> 24, the
dynamo exporter's count). The pipeline verifies the result again: cleanup
must not change numbers or dims.

The session that optimised the graph runs that very graph, so the pipeline
verifies with it (``cleanup_with_session``) instead of building a second one.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional, Tuple

import onnx

from onnx_compat.graph import all_nodes
from onnx_compat.runtimes.session import open_session


# Its transpose pushing is layout work for ONNX Runtime's own kernels: on graphs the dynamo exporter already
# optimised it added a Transpose (tiny Conformer 194 -> 195 nodes, CLAP 109 -> 110).
_DISABLED = ["TransposeOptimizer"]


def _used_domains(proto: onnx.ModelProto) -> set:
    return {"", "ai.onnx"} | {n.domain for n in all_nodes(proto)} | {f.domain for f in proto.functions}


def _inline(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A graph loaded with its data file (the weights read back into it) without the fields that loading
    leaves set: the model is the one the cleaned graph encoded whole gave, byte for byte."""
    for tensor in proto.graph.initializer:
        for name in ("data_location", "doc_string"):
            if not getattr(tensor, name):
                tensor.ClearField(name)
    return proto


def cleanup(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A cleaned copy of ``proto``: constants folded, no-ops removed, Pad fused into Conv."""
    return cleanup_with_session(proto)[0]


def cleanup_with_session(proto: onnx.ModelProto, weights=None,
                         serialized: Optional[bytes] = None) -> Tuple[onnx.ModelProto, object]:
    """``cleanup(proto)`` and the session that made it, which runs exactly that graph (one thread).

    ``weights``: the ``WeightsFolder`` holding the graph's weights (models past 2 GB); the session
    loads the graph from there and writes the cleaned weights to a data file of its own. ``serialized``:
    ``proto`` as bytes already (the exporter's own), so it is not serialised again."""
    # one thread, no repacking: the session runs three small verification shapes, and repacking every weight
    # for fast kernels costs more than it saves. Its weights go to a data file beside the cleaned graph, as raw
    # bytes: encoded into the graph's protobuf and parsed back they cost more (12 x 256 MHA encoder, 38 MB of
    # weights: the cleanup 0.27 s -> 0.22 s CPU).
    settings = dict(threads=1, prepack=False, optimization="basic", disabled_optimizers=_DISABLED)
    if weights is not None:
        saved = weights.step_path("cleanup")
        sess = open_session(weights.save_graph(proto), save_optimized=saved, saved_weights="cleanup.data", **settings)
        out = weights.adopt(saved, "cleanup")
    else:
        with tempfile.TemporaryDirectory(prefix="onnx_compat_cleanup_") as folder:
            saved = os.path.join(folder, "cleaned.onnx")
            sess = open_session(serialized or proto, save_optimized=saved, saved_weights="cleaned.data", **settings)
            out = _inline(onnx.load(saved))
    # ONNX Runtime declares every domain it knows; keep those the graph uses
    used = _used_domains(out)
    kept = [o for o in out.opset_import if o.domain in used]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    out.ir_version = proto.ir_version
    out.producer_name, out.producer_version = proto.producer_name, proto.producer_version
    del out.metadata_props[:]
    out.metadata_props.extend(proto.metadata_props)
    return out, sess
