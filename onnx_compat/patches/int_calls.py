"""``int()`` of the longest length, kept a traced size while the TorchScript exporter traces.

``padded_lengths`` (``lengths.py``) reads the maximum of a declared lengths
input as the padded dim: ``lengths.max().item()`` then gives the traced size
(a 0-d tensor) and the mask ``arange(n) < lengths[:, None]`` follows the
input's time size. ``int(lengths.max())`` (and ``int(torch.max(lengths))``)
cannot: Python's ``int()`` makes an exact int of whatever ``__int__`` returns,
so the tracer records the example's longest length as a constant and ONNX
Runtime fails to broadcast at another length (measured on torch 2.13; the
dynamo exporter keeps it symbolic by itself).

So before the TorchScript exporter traces, the model's own code (the methods
of its modules' classes, the functions they call by global name, and the
lambdas and comprehensions inside them: ``reached_functions.py``, whose walk
is kept between exports while nothing it read changed) has each call of the
builtin ``int`` pointed at ``int_of`` instead, by swapping one name in a copy
of the function's code object (the copy kept per code object). ``int_of`` returns the traced size for a maximum that
``padded_lengths`` read as the padded dim and is ``int()`` for everything
else, so no other call changes. The original code objects are back when the
trace ends. Torch's, numpy's and onnx_compat's own code is never touched, nor
``isinstance(x, int)`` (a load of ``int`` that is not called).

The called ``len`` and ``max`` are pointed at stand-ins the same way (``len_of``,
``max_of`` in ``lengths.py``), also while the dynamo exporter's non-strict
``torch.export.export`` runs the model's Python: ``make_pad_mask``'s
``bs = int(len(lengths.tolist()))`` then is the traced batch (a 0-d traced size
that ``int_of`` keeps, or the batch's symbol) and ``int(max(lengths))`` the
padded dim. Over any tensor (issue #47, 4) ``len(x)`` is the traced size of its first dim (Python's ``len()``
must return an int: TorchScript froze the batch, dynamo specialised it), and builtin ``max``/``min`` over a
real tensor of one dim its ``max()``/``min()`` (Python's iterate it: the batch unrolled or specialised).
They are ``len``, ``max`` and ``min`` for anything else. The called ``float`` is pointed at ``float_of``
(``size_floats.py``, issue #47 round three: kraken's ``float(initial_len) / o.shape[3]``): a traced or symbolic
size becomes a 0-d float tensor in the graph instead of the example's number; anything else is ``float()``.
"""
from __future__ import annotations

import dis
import sys
import types
from typing import List

import torch

from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from .length_caches import emptied
from .padding_mask import branch_free
from .reached_functions import CodeMemo, functions_of
from . import size_floats
from .size_floats import float_of

NAME = "__onnx_compat_int__"
# the builtins whose calls are pointed at a stand-in, by the global name the stand-in is loaded as
NAMES = {"int": NAME, "len": "__onnx_compat_len__", "max": "__onnx_compat_max__", "min": "__onnx_compat_min__",
         "float": "__onnx_compat_float__", "isinstance": "__onnx_compat_isinstance__"}
_kept = 0  # int(), len(), max(), min() calls that returned a traced size or a reduction (for ``patch.idle``)
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_CALLED_LOAD = sys.version_info >= (3, 11)  # LOAD_GLOBAL's low bit says the name is loaded to be called


def int_of(value, *args, **kwargs):
    """``int(value)``, except for the longest of a declared lengths input read as the padded dim, which stays
    the traced size (as its ``item()`` does)."""
    global _kept
    if not args and not kwargs and isinstance(value, torch.Tensor):
        from .lengths import padded_size_of
        size = padded_size_of(value)
        if size is not None:
            _kept += 1
            return size
    if not args and not kwargs and isinstance(value, (torch.Tensor, torch.SymInt)):
        from .lengths import kept_size
        size = kept_size(value)
        if size is not None:
            _kept += 1
            return size
    if not args and not kwargs:  # int() of any traced or symbolic size is that size (size_math.int_of_size)
        from .size_math import int_of_size
        size = int_of_size(value)
        if size is not None:
            _kept += 1
            return size
    return int(value, *args, **kwargs)


_REWRITES = CodeMemo()  # code object -> its rewrite, or _UNCHANGED (kept across exports: issue #50)
_REWRITES_NAMES = [None]  # the NAMES the kept rewrites were made with
_UNCHANGED = "unchanged"  # the memo's mark for a code object the rewrite leaves as it is (not a strong ref)


def _follow_names() -> None:
    """Empties the kept rewrites when ``NAMES`` is not what they were made with (once per redirect)."""
    key = tuple(sorted(NAMES.items()))
    if key != _REWRITES_NAMES[0]:
        _REWRITES.clear()
        _REWRITES_NAMES[0] = key


def _rewritten(code: types.CodeType) -> types.CodeType:
    """``code`` with every called ``int``/``len``/``max`` loaded as its stand-in's name (``NAMES``; nested code
    objects too); ``code`` itself when it has none. Kept per code object (``reached_functions.CodeMemo``: a
    disassembly of every function reached was a fifth of a tiny model's export, anew each time)."""
    out = _REWRITES.get(code, _rewrite)
    return code if out is _UNCHANGED else out


def _rewrite(code: types.CodeType):
    consts = tuple(_rewritten(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    out = code if consts == code.co_consts else code.replace(co_consts=consts)
    sites = [i for i in dis.get_instructions(code) if i.opcode == _LOAD_GLOBAL and i.argval in NAMES
             and i.arg & 1] if _CALLED_LOAD and set(NAMES) & set(code.co_names) else []
    if sites:
        names = code.co_names + tuple(n for n in dict.fromkeys(NAMES[i.argval] for i in sites)
                                      if n not in code.co_names)
        raw = bytearray(out.co_code)
        changed = [_point_at(raw, site, names.index(NAMES[site.argval])) for site in sites]
        if any(changed):
            out = out.replace(co_code=bytes(raw), co_names=names)
    return _UNCHANGED if out is code else out


def _point_at(raw: bytearray, site, index: int) -> bool:
    """Sets the LOAD_GLOBAL at ``site`` to load name ``index`` (keeping its called bit) when the new argument
    fits the bytes the old one had (its EXTENDED_ARG prefixes)."""
    prefixes, at = 0, site.offset - 2
    while at >= 0 and raw[at] == _EXTENDED_ARG:
        prefixes, at = prefixes + 1, at - 2
    arg = (index << 1) | 1
    if arg >= 1 << (8 * (prefixes + 1)):
        return False
    for k in range(prefixes + 1):
        raw[site.offset + 1 - 2 * k] = (arg >> (8 * k)) & 0xFF
    return True


def _redirect(fns: List[types.FunctionType]) -> List[tuple]:
    """Points the called ``int`` of each function at ``int_of``; returns what ``_restore`` puts back."""
    from .lengths import len_of, max_of, min_of
    from .size_math import isinstance_of
    stand_ins = {NAME: int_of, NAMES["len"]: len_of, NAMES["max"]: max_of, NAMES["min"]: min_of,
                 NAMES["float"]: float_of, NAMES["isinstance"]: isinstance_of}
    undo = []
    _follow_names()
    for fn in fns:
        code = _rewritten(fn.__code__)
        if code is fn.__code__:
            continue
        added = [n for n in stand_ins if n not in fn.__globals__]
        fn.__globals__.update(stand_ins)
        undo.append((fn, fn.__code__, added))
        fn.__code__ = code
    return undo


def _restore(undo: List[tuple]) -> None:
    for fn, code, added in reversed(undo):
        fn.__code__ = code
        for name in added:
            fn.__globals__.pop(name, None)


def _traced_with_int_calls(wrapped, instance, args, kwargs):
    """``torch.jit._get_trace_graph(model, ...)`` of an ONNX export, the model's ``int`` calls redirected."""
    root = args[0] if args else kwargs.get("f", kwargs.get("mod"))
    strict = wrapped.__name__ == "export" and kwargs.get("strict", False)  # dynamo's bytecode sees no stand-in
    if not torch.onnx.is_in_onnx_export() or root is None or strict:
        idle("padded_lengths_int")
        return wrapped(*args, **kwargs)
    from .lengths import forget_batch, substitutions, weights_of  # len_of/max_of/min_of count their own calls
    undo, before = _redirect(functions_of(root)), _kept + substitutions() + size_floats.kept()
    weights_of(root)
    try:
        # the length_caches patch: caches grown before the export are grown in the trace; padding_mask_frames:
        # forward_padding_mask without its branch
        with emptied(root), branch_free(root):
            return wrapped(*args, **kwargs)
    finally:
        _restore(undo)
        forget_batch()
        if _kept + substitutions() + size_floats.kept() == before:
            idle("padded_lengths_int")


register(Patch(
    name="padded_lengths_int",
    description="int(lengths.max()) of a declared lengths input stays the traced padded dim under TorchScript "
                "(the model's int() calls go through one that knows the padded maximum while it traces); the "
                "model's len(), builtin max()/min() and float() of a traced size stay in the graph",
    # torch.export.export: the dynamo exporter's non-strict trace runs the model's Python, where len() of the
    # lengths' tolist() must give the batch's symbol and int() of it keep it
    targets=("torch.jit:_get_trace_graph", "torch.export:export"),
    wrapper=_traced_with_int_calls,
    when="always",
    aliases=False,  # no requires: without padded_lengths no maximum is marked and int_of is int()
))
