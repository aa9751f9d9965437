"""``x.data`` read while a model is traced: the same tensor, as an op the exporters see.

``.data`` hands out an alias of a tensor that no trace records. TorchScript takes it for a constant: its values
and sizes are baked at the example and a write through it (``lp.data.masked_fill_(mask, -1e4)``) is lost from
the graph; dynamo lifts it into the exported program as a constant and stops ("a fake tensor in the exported
program constant's list"), or crashes in its decompositions (``aten.set_`` of a fake storage). Older model code reads and writes through it (torch-struct's linear chain:
``semiring.zero_mask_(lp.data, mask)``). ``detach()`` is the same alias as a traced op: the same values, writes
that reach the tensor, no gradient, as ``.data`` gives; under TorchScript a tensor other than a parameter is
read as itself. Outside a trace ``.data`` is torch's own.
"""
from __future__ import annotations

import torch

from onnx_compat.patches.patch import Patch, idle
from onnx_compat.patches.registry import register

NAME = "data_as_detach"


def _fake(tensor) -> bool:
    """dynamo's fake (or functional) tensor: the model is being traced by torch.export."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor
    return isinstance(tensor, (FakeTensor, FunctionalTensor))


def _read(wrapped, instance, args, kwargs):
    """TorchScript loses a write into an alias it traced (its in-place pass rewrites only the written value),
    so there a tensor is its own ``.data`` (a parameter, a leaf that wants gradients, is detached: autograd
    refuses writes into it); dynamo's functionalization carries writes into a ``detach()``."""
    tensor = args[0]
    if isinstance(tensor, torch.Tensor):
        if torch.jit.is_tracing():
            return tensor.detach() if tensor.is_leaf and tensor.requires_grad else tensor
        if _fake(tensor):
            return tensor.detach()
    idle(NAME)
    return wrapped(*args, **kwargs)


register(Patch(
    name=NAME,
    description="Tensor.data read while a model is traced is the tensor as an op the exporter records "
                "(detach() under dynamo, the tensor itself under TorchScript): its sizes follow the input and "
                "writes through it reach the tensor (TorchScript baked and lost them; dynamo stopped at a fake "
                "tensor among the program's constants, or crashed in its decompositions)",
    targets=("torch:Tensor.data",),
    aliases=False,  # a descriptor, never imported under a name of its own
    wrapper=_read,
    when="export",
))
