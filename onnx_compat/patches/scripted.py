"""Helpers compiled with ``torch.jit.script`` / ``torch.jit.script_if_tracing`` inside libraries.

Separation and codec libraries script their activations and normalisation
helpers (``@torch.jit.script def snake(x, alpha)``, ``@script_if_tracing def
z_norm(x, dims)``). While exporting, a call to such a function runs the
TorchScript interpreter instead of the Python the exporters can follow:

* the TorchScript exporter records the call with its int arguments as
  constants: ``pad_to(x, 2 * x.shape[-1])`` pads to the example's length at
  every length (silently wrong, measured on torch 2.13);
* the dynamo exporter runs the interpreter on fake tensors, whose sizes come
  back as new, data-dependent symbols.

While exporting, a scripted function runs its Python source instead (kept by
``torch.jit.script`` as ``_torchdynamo_inline``; ``script_if_tracing``
scripts that same Python function first). Under the TorchScript exporter a
function with a loop or a use of a tensor's value as a Python number stays
scripted: traced as Python the trip count or the branch would be baked
(silently), scripted they are written as ONNX ``Loop``/``If``, unless an
argument is a complex value of the spectral patches (a real/imaginary pair,
which TorchScript cannot take): then the Python runs, and verification at
new sizes judges what tracing it recorded.
"""
from __future__ import annotations

from onnx_compat.patches.registry import Patch, register
from ._complex import ComplexPair
from .when import torchscript_exporting


# What tracing the Python would bake: a loop's trip count, or a tensor's value turned into a Python
# bool/number (a data-dependent branch or size). Scripted, TorchScript writes them as Loop/If nodes.
_TRACING_BAKES = frozenset(("prim::Loop", "aten::Bool", "aten::is_nonzero", "aten::item", "aten::Int",
                            "aten::Float", "aten::IntImplicit", "aten::FloatImplicit", "aten::ScalarImplicit",
                            "prim::tolist"))


def _tracing_bakes(block) -> bool:
    for node in block.nodes():
        if node.kind() in _TRACING_BAKES or any(_tracing_bakes(b) for b in node.blocks()):
            return True
    return False


def _python_source(function):
    """The Python function a ``ScriptFunction`` was compiled from, or None."""
    original = getattr(function, "_torchdynamo_inline", None)
    return original if callable(original) else None


def _has_pair(args, kwargs) -> bool:
    return any(isinstance(a, ComplexPair) for a in (*args, *kwargs.values()))


def _call(wrapped, instance, args, kwargs):
    original = _python_source(instance)
    if original is None:
        return wrapped(*args, **kwargs)
    if torchscript_exporting() and _tracing_bakes(instance.graph) and not _has_pair(args, kwargs):
        return wrapped(*args, **kwargs)
    return original(*args, **kwargs)


register(Patch(
    name="scripted_as_python",
    description="functions compiled with torch.jit.script / script_if_tracing run their Python source while "
                "exporting (TorchScript baked their int arguments; loops and value branches stay scripted there)",
    targets=("torch.jit:ScriptFunction.__call__",),
    wrapper=_call,
    when="export",
    aliases=False,
))
