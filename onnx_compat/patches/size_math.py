"""``math.ceil`` / ``math.floor`` of a size traced by the TorchScript exporter.

Models pad to a multiple of the hop with ``n = math.ceil(length / hop)`` and
crop resampled signals to ``math.floor(new_sr * length / old_sr)``. The
TorchScript exporter traces ``length = x.shape[-1]`` as a 0-d tensor and
``math`` turns it into a Python float: the example's size is baked in and
the graph is wrong at every other length (measured on torch 2.13; dynamo
keeps ``math.ceil`` of its symbolic sizes exact by itself). While the
TorchScript exporter traces, ``math.ceil``/``math.floor`` of a 0-d tensor
give a 0-d int64 tensor computed in the graph, so the size stays symbolic.
Sizes are exact in the float32 quotient up to 2**24.

``int(...)``, ``round(...)``, ``max``/``min`` and comparisons of such a size
still turn it into a Python number (Python requires ``int()`` to return an
int): those forms stay baked; see docs/patterns.md.
"""
from __future__ import annotations

import torch

from onnx_compat.patches.registry import Patch, register


def _rounding(wrapped, instance, args, kwargs):
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() != 0 \
            or args[0].is_complex():
        return wrapped(*args, **kwargs)
    rounder = torch.ceil if wrapped.__name__ == "ceil" else torch.floor
    value = args[0]
    if not value.is_floating_point():
        return value.to(torch.int64)
    return rounder(value).to(torch.int64)


register(Patch(
    name="size_rounding",
    description="math.ceil / math.floor of a traced size stay in the graph under TorchScript "
                "(pad-to-a-multiple and resampled lengths were baked at the example's size)",
    targets=("math:ceil", "math:floor"),
    wrapper=_rounding,
    when="torchscript",
))
