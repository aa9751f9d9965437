"""Indices of a data-dependent count turned into a Python list to index with, kept the tensor they came from.

Mixture-of-experts blocks gather each expert's frames by Python lists, "faster to index using lists than torch
tensors" (mambapy's Jamba, ``mambapy/jamba.py:507``; older Mixtral-style blocks)::

    idx, top_x = torch.where(expert_mask[e])
    top_x_list, idx_list = top_x.tolist(), idx.tolist()
    current = hidden[None, top_x_list].reshape(-1, hidden_dim)
    weighted = expert(current) * routing_weights[top_x_list, idx_list, None]

How many indices there are is a value of the data (an unbacked size to torch.export), so dynamo stops in
``tolist()``, which makes one Python number per element ("Could not guard on data-dependent expression").
Indexing with a list of ints is indexing with the integer tensor it came from. While dynamo exports,
``Tensor.tolist()`` of a 1-d integer tensor whose length only the data decides returns that tensor (asked by
``constant_values``' hook on ``tolist``, ``constants.py``, which this patch selects); any other ``tolist()`` is
as before, and eager code never sees this (a list, as always).

What the list is then used for is the model's: as indices it is the same; used as a list (``a + b`` joins lists
but adds tensors, ``lst * 2`` repeats a list but doubles a tensor) it would not be, and the graph would differ
from the model, which verification compares it with. Where the length is not data-dependent, ``tolist()``
already exported before (it is torch's own there).
"""
from __future__ import annotations

import torch

from onnx_compat.patches.patch import Patch, acted, through
from onnx_compat.patches.registry import in_place, register

NAME = "tolist_as_index"
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _data_dependent_indices(t) -> bool:
    """A 1-d integer tensor whose length is a size only the data decides (``nonzero``, ``torch.where(mask)``)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INTEGER:
        return False
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols
    length = t.shape[0]
    return isinstance(length, torch.SymInt) and has_free_unbacked_symbols(length)


def kept(tensor, args, kwargs) -> bool:
    """Whether ``tensor.tolist(*args, **kwargs)``, met while dynamo traces, is ``tensor`` itself: this patch in
    place and ``tensor`` indices of a data-dependent count. Asked by ``constant_values``' ``tolist`` hook
    (``constants.py``), which owns that target."""
    if not in_place(NAME) or args or kwargs or not _data_dependent_indices(tensor):
        return False
    acted(NAME)
    return True


register(Patch(
    name=NAME,
    description="Tensor.tolist() of indices whose count only the data decides (a mixture-of-experts expert's "
                "frames from torch.where, gathered by Python lists) is the index tensor itself under dynamo, "
                "which indexes the same, instead of stopping at a guard per element",
    # no target of its own: constant_values' tolist hook (constants.py) asks kept() while this is in place
    targets=(),
    wrapper=through,
    when="dynamo",
    requires=("constant_values",),
))
