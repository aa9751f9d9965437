"""An identity's constant (``x + 0``, ``x * 1``) matched only exactly by onnxscript's rewriter.

torch.onnx's dynamo exporter optimises the graph it writes with onnxscript's rewriter, whose no-op rules
replace ``x + 0``, ``x - 0``, ``x * 1`` and ``x / 1`` by ``x``. A pattern's constant matches within a tolerance
(``math.isclose``, rel 1e-5, abs 1e-8: ``onnxscript/rewriter/_pattern_ir.py``, 0.7.2), and float32's
``1e-8`` is 9.99999994e-09, inside it: ``x / (y + 1e-8)``, the guard of an overlap-add envelope that is zero at
the edges (ClearVoice FRCRN's iSTFT, ``conv_stft.py:191``), loses its ``Add`` and the graph gives ``0 / 0 = NaN``
where eager gives 0 (measured on torch 2.13: ``x / (x.abs() + 1e-8)`` at ``x = 0``; ``optimize=False`` keeps it).

While patched, a pattern constant of 0 or 1 matches only the same number exactly; every other constant
(an activation's coefficients, matched by the fusion rules) keeps onnxscript's tolerance.
"""
from __future__ import annotations

from onnx_compat.patches.registry import Patch, register

_NAME = "exact_identities"
_TARGET = "onnxscript.rewriter._matcher:SimplePatternMatcher._match_constant"
_IDENTITIES = (0, 1)


def _exact(wrapped, instance, args, kwargs):
    matched = wrapped(*args, **kwargs)
    pattern = args[0] if args else kwargs.get("pattern_constant")
    value = args[1] if len(args) > 1 else kwargs.get("value")
    if not matched or pattern is None or value is None:
        return matched
    expected = pattern.value if isinstance(pattern.value, list) else [pattern.value]
    if not any(e in _IDENTITIES for e in expected):
        return matched
    found = value.const_value.numpy().reshape(-1)
    if all(float(f) == float(e) for f, e in zip(found.tolist(), expected)):
        return matched
    return instance.fail(f"Constant value mismatch: expected exactly {pattern.value}, got {found.tolist()} "
                         f"(onnx_compat: an identity's constant matches only exactly)")


register(Patch(
    name=_NAME,
    description="onnxscript's no-op rules (x + 0, x * 1) no longer take a small constant for the identity: "
                "x / (y + 1e-8) keeps its Add in dynamo's optimised graph instead of 0 / 0 = NaN",
    targets=(_TARGET,),
    on_import=(_TARGET,),  # onnxscript's rewriter is loaded by the dynamo export
    wrapper=_exact,
    when="always",  # the optimiser runs after the capture, still inside torch.onnx.export; installed only while patched
    aliases=False,
    library="onnxscript",
))
