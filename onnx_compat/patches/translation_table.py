"""torch.onnx's table of ONNX translations, built once per process instead of at every dynamo export.

Each ``torch.onnx.export(dynamo=True)`` builds a new ``ONNXRegistry.from_torchlib()``: every torchlib function's
ONNX IR, whose first use parses its Python source (``inspect.getsource`` of ~500 functions). On torch 2.13 that is
0.6-0.7 s of every export after the first (1.3 s the first time), measured alone, against ~1 s for the whole dynamo
export of a two-layer model: the largest fixed cost of a small export, paid again by ``auto``'s second export, by
every capture a rewrite runs again (``strict_retry``) and by each export of a session.

While patched, the table built for the same class and opset is handed out again as a fresh registry: a new dict
of new lists over the same translation records, so what one export registers (``custom_translation_table``, an
``insert`` into a list) never reaches the next. A torchlib registry that has grown since (a function registered
in between) builds a new table.
"""
from __future__ import annotations

import inspect

from onnx_compat.patches.registry import Patch, register

_TARGET = "torch.onnx._internal.exporter._registration:ONNXRegistry.from_torchlib"
_built: dict = {}  # (class, arguments, torchlib sizes) -> the registry first built for them


def _torchlib_sizes():
    """How many translations each torchlib registry holds: a key that changes when one is registered."""
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 (ops: registers them, as
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry, ops as _ops  # noqa: F401 torch does)
    functions = registration.default_registry._registry.values()
    return sum(len(f.overloads) + len(f.complex) for f in functions), len(_torchlib_registry._registry)


def fresh_copy(table):
    """A registry of its own over the same translation records: its dict and its lists are new."""
    copy = object.__new__(type(table))
    copy.__dict__.update(table.__dict__)
    copy.functions = {target: list(entries) for target, entries in table.functions.items()}
    return copy


def _arguments(wrapped, args, kwargs) -> tuple:
    """The call's arguments by name, defaults filled in: ``from_torchlib()`` and ``from_torchlib(opset_version=18)``
    are one table."""
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.items())


def _kept_table(wrapped, instance, args, kwargs):
    try:
        owner = instance if isinstance(instance, type) else type(instance)  # called on the class or an instance
        key = (owner, _arguments(wrapped, args, kwargs), _torchlib_sizes())
        hash(key)
    except Exception:  # an argument that cannot be a key, or a torch whose registries are elsewhere
        return wrapped(*args, **kwargs)
    if key not in _built:
        _built[key] = wrapped(*args, **kwargs)
    return fresh_copy(_built[key])


register(Patch(
    name="translation_table",
    description="the dynamo exporter's table of ONNX translations is built once per process, not at every export "
                "(0.6-0.7 s of each; each export gets its own copy)",
    targets=(_TARGET,),
    on_import=(_TARGET,),  # torch.onnx's exporter modules are not loaded by a TorchScript export
    wrapper=_kept_table,
    when="always",  # built before the capture, where no export flag is up yet; installed only while patched
    aliases=False,
))
