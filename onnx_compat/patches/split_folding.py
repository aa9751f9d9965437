"""onnxscript's constant folding of ``SplitToSequence`` whose split size is a size of the graph.

torch.onnx's dynamo exporter folds the graph it writes with onnxscript's optimiser. Its rule for
``SplitToSequence`` (``_constant_folding.split_to_sequence``, onnxscript 0.7.2) turns the node into a ``Split`` of
a known number of outputs; it reads the split's shape when it is static and then takes that shape to be 1-d, so
a scalar split size computed from a dynamic dim (``first, second = x.split(x.shape[1] // 2, dim=1)``: a 0-d
value, no constant) falls through to ``None.ndim`` and the whole export stops: "Error during constant folding for
node (::SplitToSequence)", "'NoneType' object has no attribute 'ndim'" (measured on torch 2.13; reformer-pytorch's
and performer-pytorch's chunked attention stop there).

While patched, the rule is not run on such a node: it stays the ``SplitToSequence`` it is, which ONNX Runtime
splits at every size, as the rule itself answers where it has no number to fold with. A split given as a
constant, or as a 1-d list, is folded as before.
"""
from __future__ import annotations

from onnx_compat.patches.registry import Patch, register

_NAME = "split_size_folding"
_TARGET = "onnxscript.optimizer._constant_folding:PartialEvaluatorRegistry.lookup_evaluators"


def _scalar_size_unknown(node) -> bool:
    """The node's split size is a 0-d value of the graph with no constant behind it."""
    from onnxscript.optimizer import _constant_folding
    split = node.inputs[1] if len(node.inputs) > 1 else None
    if split is None or split.shape is None or not split.shape.is_static() or len(split.shape) == 1:
        return False
    return _constant_folding._get_numpy_value(split) is None


def _unless_size_unknown(rule):
    def split_to_sequence(node, op, state):
        if _scalar_size_unknown(node):
            return None  # the rule's own answer where it has nothing to fold with
        return rule(node, op, state)
    return split_to_sequence


def _guarded(wrapped, instance, args, kwargs):
    rules = wrapped(*args, **kwargs)
    names = dict(zip(("domain", "opname"), args), **kwargs)
    if names.get("domain") in ("", "ai.onnx") and names.get("opname") == "SplitToSequence":
        return [_unless_size_unknown(rule) for rule in rules]
    return rules


register(Patch(
    name=_NAME,
    description="onnxscript's constant folding leaves SplitToSequence alone where the split size is a size of the "
                "graph (x.split(x.shape[1] // 2)): its rule crashed the dynamo export ('NoneType' has no 'ndim')",
    targets=(_TARGET,),
    on_import=(_TARGET,),  # onnxscript's optimiser is loaded by the dynamo export
    wrapper=_guarded,
    when="always",  # the optimiser runs after the capture, still inside torch.onnx.export; installed only while patched
    aliases=False,
    library="onnxscript",
))
