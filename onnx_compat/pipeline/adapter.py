"""The user's model seen with flat ONNX I/O, and the check of what it returns.

Exporters want ``forward(*tensors) -> tuple of tensors``. ``IOAdapter`` maps
the ONNX inputs onto the model's forward arguments and flattens what it
returns; ``check_outputs`` compares that with the declared outputs and names
the culprit (output, dim) when they differ.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from onnx_compat.errors import SpecError
from onnx_compat.patches.lengths import declared
from onnx_compat.spec import Dim, TensorSpec, size_name


class IOAdapter(torch.nn.Module):
    """The user's model with ``forward(*tensors) -> tuple of tensors``, as the exporters want it."""

    MODEL_ATTR = "model"  # the attribute holding the user's model: the first part of every scope in the graph

    def __init__(self, model: torch.nn.Module, pairs: Sequence[Tuple[str, Optional[str]]],
                 outputs: Sequence[TensorSpec]) -> None:
        super().__init__()
        self.model = model
        self.arg_names = [arg for _, arg in pairs]
        self.lengths = lengths_of([name for name, _ in pairs])
        self.length_dtypes = [spec.lengths_dtype for spec in outputs for _ in spec.lengths]
        self.layout = [len(spec.lengths) for spec in outputs]
        self.train(model.training)  # a new Module trains; the exporter ends with train(root_flag) on this one

    def forward(self, *tensors: torch.Tensor):
        with declared(tensors, self.lengths):  # the longest length is the padded dim (patches/lengths.py)
            if self.arg_names and self.arg_names[0] is not None:
                result = self.model(**dict(zip(self.arg_names, tensors)))
            else:
                result = self.model(*tensors)
        flat = flatten(result)
        if len(flat) != sum(1 + n for n in self.layout):
            return tuple(flat)  # check_outputs reports the mismatch with names
        out, i, k = [], 0, 0
        for n_lengths in self.layout:
            out.append(flat[i])
            for lengths in flat[i + 1:i + 1 + n_lengths]:
                out.append(lengths.to(self.length_dtypes[k]))
                k += 1
            i += 1 + n_lengths
        return tuple(out)


def lengths_of(names: Sequence[str]) -> Dict[int, Tuple[int, int, str]]:
    """``{position of a lengths input: (position of its tensor, axis, its ONNX name)}`` from the ONNX input
    names (a tensor's lengths are named ``size_name(tensor, axis)``)."""
    found = {}
    for j, name in enumerate(names):
        for i, other in enumerate(names):
            axis = other[len(name) + len(":size"):] if other.startswith(f"{name}:size") else ""
            if axis.isdigit() and other == size_name(name, int(axis)):
                found[i] = (j, int(axis), other)
    return found


def flatten(result) -> List[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in flatten(item)]
    if isinstance(result, dict):
        return [t for item in result.values() for t in flatten(item)]
    raise SpecError(f"the model returned a {type(result).__name__}; expected tensors (alone, in a tuple, list or dict)")


def check_outputs(returned: Sequence[torch.Tensor], outputs: Sequence[TensorSpec],
                  sizes: Dict[str, int]) -> List[TensorSpec]:
    """Check ``returned`` against ``outputs``; return the specs with None dims filled in.

    ``sizes`` are the example's named dim sizes: an output dim named like an
    input dim must have that size.
    """
    names = [n for spec in outputs for n in spec.onnx_names]
    if len(returned) != len(names):
        raise SpecError(f"the model returned {len(returned)} tensor(s) but {len(names)} outputs are declared "
                        f"({names}); declared lengths (name:sizeN) must be returned by the model after their tensor")
    filled, i = [], 0
    for spec in outputs:
        tensor = returned[i]
        if not isinstance(tensor, torch.Tensor):
            raise SpecError(f"output {spec.name!r}: the model returned {type(tensor).__name__}, not a tensor")
        if tensor.dim() != len(spec.dims):
            raise SpecError(f"output {spec.name!r}: declared rank {len(spec.dims)} {list(_dims_text(spec))}, "
                            f"the model returned rank {tensor.dim()} {list(tensor.shape)}")
        if tensor.is_complex():
            raise SpecError(f"output {spec.name!r}: the model returns a complex tensor ({tensor.dtype}); exported "
                            f"graphs carry real tensors: return torch.view_as_real(...) (or abs/angle) instead")
        if tensor.dtype != spec.dtype:
            raise SpecError(f"output {spec.name!r}: declared dtype {spec.dtype}, the model returned {tensor.dtype}")
        dims = []
        for axis, (dim, size) in enumerate(zip(spec.dims, tensor.shape)):
            if isinstance(dim, int) and dim != size:
                raise SpecError(f"output {spec.name!r} dim {axis}: declared static size {dim}, the model returned {size}")
            if isinstance(dim, Dim) and dim.name in sizes and sizes[dim.name] != size:
                raise SpecError(f"output {spec.name!r} dim {axis} ({dim.name!r}): has size {size} but {dim.name!r} "
                                f"is {sizes[dim.name]} in the inputs; give this dim its own Dim name")
            dims.append(int(size) if dim is None else dim)
        for k, axis in enumerate(spec.lengths):
            lengths = returned[i + 1 + k]
            name = size_name(spec.name, axis)
            if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.shape[0] != tensor.shape[0]:
                got = list(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
                raise SpecError(f"output {name!r}: lengths must be a [B] tensor with B={tensor.shape[0]}, got {got}")
            if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
                raise SpecError(f"output {name!r}: lengths must be integers, the model returned {lengths.dtype}")
            if int(lengths.max()) > tensor.shape[axis] or int(lengths.min()) < 0:
                raise SpecError(f"output {name!r}: lengths {lengths.tolist()} do not fit dim {axis} of "
                                f"{spec.name!r} (size {tensor.shape[axis]})")
        filled.append(TensorSpec(spec.name, dims, spec.dtype, spec.lengths, spec.lengths_dtype))
        i += 1 + len(spec.lengths)
    return filled


def _dims_text(spec: TensorSpec):
    return [d.name if isinstance(d, Dim) else d for d in spec.dims]
