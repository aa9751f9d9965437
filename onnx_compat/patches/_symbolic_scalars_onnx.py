"""ONNX translations of the ATen ops whose number argument may be a size of the graph (``i % x.shape[1]``).

Why: torchlib's translations of these ``Scalar`` overloads (onnxscript 0.7.2: ``remainder``, ``pow``, the bitwise
ops and the shifts) make the number a constant of the graph (``ir.tensor(other, dtype=self.dtype)``). Under the
dynamo exporter a number computed from a dynamic size is a ``SymInt``, handed to the translation as a value of the
graph, and the export stops: "int() argument must be a string, a bytes-like object or a real number, not
'SymbolicTensor'" (measured on torch 2.13: ``torch.arange(2 * n) % n`` with ``n = x.shape[1]``; reformer-pytorch's
bucket arithmetic stops there), and ``mul`` of a bool tensor by a size (``mask * (T % 3 + 1)``; block attention's
mask scaled by a size branch's indicator, ``size_branches.py``). ``add``, ``sub``, ``div``, ``fmod``, the
comparisons and ``mul`` of a float or integer tensor and a size export already (torch.export writes them with the
``Tensor`` overload).

A Python number goes to torchlib's own translation, unchanged. A value of the graph is cast to the dtype torch
gives the result (the tensor's; float32 for an integer tensor and a float size; int64 for a bool tensor and an
integer size) and the op's ``Tensor`` translation takes both operands, as torch computes it in eager.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

# ATen overload -> (the torchlib translation taking two tensors, which argument is the number)
_SCALAR_FORMS: Dict[str, Tuple[str, int]] = {
    "remainder.Scalar": ("remainder.Tensor", 1),
    "mul.Scalar": ("mul.Tensor", 1),
    "remainder.Scalar_Tensor": ("remainder.Tensor", 0),
    "pow.Tensor_Scalar": ("pow.Tensor_Tensor", 1),
    **{f"bitwise_{kind}.Scalar": (f"bitwise_{kind}.Tensor", 1) for kind in ("and", "or", "xor")},
    **{f"bitwise_{kind}.Scalar_Tensor": (f"bitwise_{kind}.Tensor", 0) for kind in ("and", "or", "xor")},
    **{f"bitwise_{side}_shift.Tensor_Scalar": (f"bitwise_{side}_shift.Tensor", 1) for side in ("left", "right")},
    **{f"bitwise_{side}_shift.Scalar_Tensor": (f"bitwise_{side}_shift.Tensor", 0) for side in ("left", "right")},
    "__lshift__.Scalar": ("bitwise_left_shift.Tensor", 1),
    "__rshift__.Scalar": ("bitwise_right_shift.Tensor", 1),
}


def _torchlib(name: str) -> Optional[Callable]:
    """torchlib's (first) translation of ``aten::name``, as torch.onnx's table is built from it; None where this
    onnxscript has none."""
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 (ops: registers them)
    entry = registration.default_registry._registry.get(f"aten::{name}")
    return entry.overloads[0] if entry is not None and entry.overloads else None


def _result_dtype(tensor, number):
    """The dtype torch gives ``tensor <op> number`` for a number that is a size of the graph (int64, or a float
    from size arithmetic): a number never widens a tensor of its own kind."""
    from onnx_ir import DataType
    if tensor.dtype.is_floating_point() or not number.dtype.is_floating_point():
        return DataType.INT64 if tensor.dtype == DataType.BOOL else tensor.dtype
    return DataType.FLOAT


def _cast(value, dtype):
    from onnxscript import opset18 as op
    return value if value.dtype == dtype else op.Cast(value, to=dtype)


def _translation(scalar_form: Callable, tensor_form: Callable, number_at: int) -> Callable:
    """The overload's translation: torchlib's own for a Python number, its ``Tensor`` form for a graph value."""

    def take_number_second(self, other: float):
        return _either(self, other)

    def take_number_first(self: float, other):
        return _either(self, other)

    def _either(*operands):
        number, tensor = operands[number_at], operands[1 - number_at]
        if isinstance(number, (bool, int, float)):
            return scalar_form(*operands)
        dtype = _result_dtype(tensor, number)
        cast = [_cast(v, dtype) for v in operands]
        return tensor_form(*cast)

    return take_number_second if number_at == 1 else take_number_first


def translations() -> dict:
    """The ATen overloads -> their translations, for ``custom_translation_table`` (those this onnxscript has both
    forms of)."""
    import torch
    table = {}
    for name, (tensor_name, number_at) in _SCALAR_FORMS.items():
        base, overload = name.split(".")
        scalar_form, tensor_form = _torchlib(name), _torchlib(tensor_name)
        if scalar_form is not None and tensor_form is not None:
            table[getattr(getattr(torch.ops.aten, base), overload)] = _translation(scalar_form, tensor_form, number_at)
    return table
