"""int32 sizes in a TorchScript export's graph, cast to int64 before the file is written.

Models compute sizes from int32 lengths (the spec's default lengths dtype, and
RASR's): espnet's ``make_pad_mask`` makes ``torch.ones(maxlen + 1, maxlen + 1)``
with ``maxlen = lengths.max()``. PyTorch promotes int32 and int64 silently; the
TorchScript exporter writes the ops as traced, so the graph gives
``ConstantOfShape`` an int32 shape, or a ``Concat`` mixed int32 and int64
inputs, and ONNX Runtime refuses to load it ("ConstantOfShape ... has
unsupported type: tensor(int32)", measured on torch 2.13 in the second sweep).
``export()`` repairs the graph after the export (``int_repair.py``); a
bare ``torch.onnx.export`` inside ``patched()`` wrote the graph that does not
load.

So the TorchScript exporter's serialised model passes through the same repair
before it is written: the int32 inputs of such ops are cast to int64, which is
what PyTorch computed. A graph with nothing to cast is written byte for byte
as the exporter made it. The casts are named so that ``export()``'s report
still lists them.
"""
from __future__ import annotations

import torch

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register


def _loadable(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    if not isinstance(out, bytes) or not torch.onnx.is_in_onnx_export():
        idle("int32_sizes")
        return out
    import onnx
    from onnx_compat.int_repair import REPAIRED_WHILE_EXPORTING, repair_int_types
    try:
        proto = onnx.load_model_from_string(out)
    except Exception:  # noqa: BLE001 - a model onnx cannot read here is written as the exporter made it
        idle("int32_sizes")
        return out
    fixed, done = repair_int_types(proto, prefix=REPAIRED_WHILE_EXPORTING)
    if not done:
        idle("int32_sizes")
        return out
    return fixed.SerializeToString()


_PROTO_UTILS = ("torch.onnx._internal.torchscript_exporter.onnx_proto_utils:_add_onnxscript_fn",
                "torch.onnx._internal.onnx_proto_utils:_add_onnxscript_fn")

register(Patch(
    name="int32_sizes",
    description="int32 sizes a TorchScript graph computes from int32 lengths (a ConstantOfShape or Concat ONNX "
                "refuses to load) are cast to int64 before the file is written",
    targets=_PROTO_UTILS,
    optional=_PROTO_UTILS,
    on_import=_PROTO_UTILS,
    wrapper=_loadable,
    when="always",
    aliases=False,
))
