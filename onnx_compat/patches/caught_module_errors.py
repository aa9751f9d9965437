"""A module call that raises, caught by the model, leaves torch.fx's module stack as it was before the call.

speechbrain's x-vector tries each layer with the lengths and falls back without them::

    for layer in self.blocks:
        try:
            x = layer(x, lengths=lens)
        except TypeError:
            x = layer(x)

torch.fx's ``Tracer.call_module`` (which torch.export's non-strict capture runs every module call through) pushes
the module on its ``module_stack`` before the call and pops it after, with no ``finally``: the layer's
``TypeError`` leaves its entry behind, and the capture fails much later, where the model's own call returns
("Unexpected key _export_root.blocks.16, expected _export_root", torch 2.13). While patched, a call that raises
takes its entries off the stack again before the error goes on; a call that returns is untouched.
"""
from __future__ import annotations

from onnx_compat.patches.registry import Patch, register

_TARGET = "torch.fx._symbolic_trace:Tracer.call_module"


def _unwound(wrapped, instance, args, kwargs):
    stack = getattr(instance, "module_stack", None)
    depth = len(stack) if stack is not None else None
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        while depth is not None and len(stack) > depth:
            stack.popitem(last=True)
        raise


register(Patch(
    name="caught_module_errors",
    description="a module call that raises inside a model that catches it (try: layer(x, lengths=l) except "
                "TypeError: layer(x)) no longer leaves torch.fx's module stack behind under dynamo",
    targets=(_TARGET,),
    on_import=(_TARGET,),  # torch.fx's tracer is loaded by the dynamo export
    wrapper=_unwound,
    when="dynamo",
    aliases=False,
))
