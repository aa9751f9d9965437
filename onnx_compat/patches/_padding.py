"""String padding ("same"/"valid") as explicit integers.

PyTorch resolves ``padding="same"`` inside the convolution kernel. The
TorchScript ONNX exporter turns that into ``Conv(auto_pad=...)``, which the ONNX
spec deprecates and ONNX Runtime cannot run with dilation > 1; torch 2.0 cannot
export it at all. These pure functions reproduce PyTorch's own rule so a patch
can pass explicit pads instead. They need no export and no tensor to test.

PyTorch's rule, per spatial dim: ``total = dilation * (kernel - 1)``,
``left = total // 2``, ``right = total - left`` (the odd element goes right).
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

IntOrSeq = Union[int, Sequence[int]]
Pads = Tuple[Tuple[int, int], ...]


def as_tuple(value: IntOrSeq, n: int, name: str = "value") -> Tuple[int, ...]:
    """``value`` as an ``n``-tuple of ints (an int is repeated)."""
    if isinstance(value, int):
        return (value,) * n
    out = tuple(int(v) for v in value)
    if len(out) == 1 and n > 1:
        return out * n
    if len(out) != n:
        raise ValueError(f"{name} must have {n} entries, got {tuple(value)!r}")
    return out


def same_pads(kernel_size: IntOrSeq, dilation: IntOrSeq = 1, ndim: int | None = None) -> Pads:
    """Per spatial dim ``(left, right)`` padding that ``padding="same"`` applies."""
    if ndim is None:
        ndim = 1 if isinstance(kernel_size, int) else len(kernel_size)
    kernel = as_tuple(kernel_size, ndim, "kernel_size")
    dil = as_tuple(dilation, ndim, "dilation")
    pads = []
    for k, d in zip(kernel, dil):
        if k < 1 or d < 1:
            raise ValueError(f"kernel size and dilation must be >= 1, got kernel={k}, dilation={d}")
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def is_symmetric(pads: Pads) -> bool:
    """Whether every dim pads as much on the left as on the right."""
    return all(left == right for left, right in pads)


def symmetric_padding(pads: Pads) -> Tuple[int, ...]:
    """The int padding a conv takes for symmetric ``pads``."""
    if not is_symmetric(pads):
        raise ValueError(f"padding {pads} is not symmetric")
    return tuple(left for left, _ in pads)


def f_pad_arg(pads: Pads) -> Tuple[int, ...]:
    """``pads`` in ``F.pad`` order: last spatial dim first, (left, right) each."""
    out: list[int] = []
    for left, right in reversed(pads):
        out.extend((left, right))
    return tuple(out)


def valid_output_length(length: int, kernel: int, dilation: int = 1, stride: int = 1) -> int:
    """Output length of a conv with no padding (``padding="valid"``)."""
    return max(0, (length - dilation * (kernel - 1) - 1) // stride + 1)
