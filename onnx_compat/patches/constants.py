"""Tensors made from constants in ``forward``, read back as Python numbers, under dynamo.

asteroid's global layer norm (ConvTasNet, DPRNN, DPTNet, ... : 6 of 8 of its
models in the sweep) reduces over ``torch.arange(1, len(x.shape)).tolist()``;
DCUNet pads to ``int(torch.from_numpy(self.strides)[1])``. The dynamo exporter
traces with fake tensors, so even a tensor made from Python constants has no
values and ``tolist()``/``int()`` stop the export ("Could not extract
specialized integer from data-dependent expression u0", measured on torch
2.13). The TorchScript exporter reads the example's values, right here since
they are constants.

While the dynamo exporter traces, a tensor made by ``torch.arange``,
``torch.tensor``, ``torch.as_tensor`` or ``torch.from_numpy`` from Python
numbers, lists or numpy arrays (never from a tensor or a symbolic size) keeps
its values beside it (computed with numpy, up to 4096 of them), as do its
integer casts and constant-index slices (seen in the non-strict exporter's
torch function handler: ``Tensor.__getitem__`` cannot be wrapped safely, see
the targets); ``tolist()``, ``item()``, ``int()``, ``float()`` and
``__index__`` of such a tensor return them.

``.numpy()`` of a fake tensor fails (".numpy() is not supported for tensor
subclasses"), though models call it on a constant or a buffer only to read a
dtype (``np.finfo(self.window.numpy().dtype).eps``): it gives the known
values of a tensor made from constants, and for any other tensor of static
shape a ``DtypeOnly`` that answers dtype and shape and refuses its values.

``torch.tensor`` of data holding a symbolic size (``torch.tensor(x.shape[1])``) goes to torch's Python
``torch.tensor``, as the non-strict exporter sends it there itself only when the function called is
``torch.tensor``: wrapped here it is not, and the size was baked in at the example (measured on torch 2.13).
"""
from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from onnx_compat.errors import UnsupportedPattern
from onnx_compat.patches.patch import idle
from onnx_compat.patches.registry import Patch, register
from .when import torchscript_exporting
from ._warning_site import model_frame, model_frame_outside_torch, said_at
from . import index_lists, lengths

_MAX_VALUES = 4096
_known: Dict[int, Tuple[weakref.ref, np.ndarray]] = {}


def _is_constant(value) -> bool:
    if isinstance(value, (bool, int, float, np.ndarray, np.generic)) or value is None:
        return True  # torch.SymInt / SymFloat (symbolic sizes) are no int or float
    if isinstance(value, (list, tuple)):
        return all(_is_constant(v) for v in value)
    return False


def known_values(tensor) -> Optional[np.ndarray]:
    """The values a tensor made from constants holds, or None."""
    hit = _known.get(id(tensor))
    return hit[1] if hit is not None and hit[0]() is tensor else None


def _remember(tensor, values) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.is_complex():
        return
    values = np.asarray(values)
    if values.size > _MAX_VALUES or values.shape != tuple(tensor.shape):
        return
    kind = float if tensor.dtype.is_floating_point else bool if tensor.dtype == torch.bool else np.int64
    if len(_known) > 4 * _MAX_VALUES:  # drop the entries of tensors gone (ids may be reused)
        for key in [k for k, (ref, _) in _known.items() if ref() is None]:
            del _known[key]
    _known[id(tensor)] = (weakref.ref(tensor), values.astype(kind))


def _factory_values(name: str, args, kwargs):
    if name == "arange":
        numbers = [a for a in args if not isinstance(a, torch.dtype)]
        return np.arange(*numbers) if 1 <= len(numbers) <= 3 else None
    source = args[0] if args else kwargs.get("data", kwargs.get("ndarray"))
    return None if source is None else np.asarray(source)


def _symbolic_data(name: str, args) -> bool:
    """``torch.tensor`` of data holding a symbolic size (``torch.tensor(x.shape[1])``)."""
    return name == "tensor" and bool(args) and any(
        isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) for a in torch.utils._pytree.tree_leaves(args[0]))


def _factory(wrapped, instance, args, kwargs):
    if _symbolic_data(wrapped.__name__, args) and hasattr(torch._refs, "tensor"):
        # the non-strict exporter sends such data to torch's Python torch.tensor, which traces the size, when the
        # function called is torch.tensor: wrapped here, it is not, and the size would be baked in
        return torch._refs.tensor(*args, **kwargs)
    made = wrapped(*args, **kwargs)
    shaping = {k: v for k, v in kwargs.items() if k not in ("dtype", "device", "requires_grad", "pin_memory",
                                                             "layout", "copy")}
    if _is_constant(list(args)) and _is_constant(list(shaping.values())):
        try:
            values = _factory_values(wrapped.__name__, args, shaping)
        except (TypeError, ValueError):
            values = None
        if values is not None:
            _remember(made, values)
    return made


def _derived(wrapped, instance, args, kwargs):
    """Integer casts keep the values known."""
    out = wrapped(*args, **kwargs)
    values = known_values(instance)
    if values is not None:
        _remember(out, values)
    return out


_READERS = {
    "tolist": lambda v: v.tolist(),
    "item": lambda v: v.item(),
    "__int__": lambda v: int(v.item()),
    "__index__": lambda v: int(v.item()),
    "__float__": lambda v: float(v.item()),
}


_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64, torch.bool: np.bool_,
          torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32,
          torch.int64: np.int64, torch.complex64: np.complex64, torch.complex128: np.complex128}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype not in _NUMPY:
        raise TypeError(f".numpy() of a {dtype} tensor: numpy has no such dtype")
    return np.dtype(_NUMPY[dtype])


class DtypeOnly:
    """What ``.numpy()`` gives for a tensor without values while dynamo traces: its dtype and shape, which is
    what models read it for (``np.finfo(self.window.numpy().dtype).eps``); any use of its values raises,
    naming the line that made it (``torch.onnx`` then retries in strict mode, where a buffer has its values)."""

    _KEPT = ("dtype", "shape", "ndim", "size", "itemsize")

    def __init__(self, tensor: torch.Tensor, where: str) -> None:
        self.dtype = numpy_dtype(tensor.dtype)
        self.shape, self.ndim, self.where = tuple(int(d) for d in tensor.shape), tensor.dim(), where
        self.size, self.itemsize = int(np.prod(self.shape)), self.dtype.itemsize

    def _refuse(self, *args, **kwargs):
        raise UnsupportedPattern(f"{self.where}: .numpy() of a tensor whose values are not known while the dynamo "
                                  f"exporter traces: only its dtype and shape can be read here (compute with "
                                  f"torch ops on the tensor instead; where its values choose sizes downstream, "
                                  f"e.g. periods or top-k positions, fix those sizes in the model to export it)")

    def __getattr__(self, name):
        self._refuse()

    __array__ = __getitem__ = __iter__ = __len__ = __float__ = __int__ = __bool__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __abs__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __index__ = _refuse


def _numpy(wrapped, instance, args, kwargs):
    """``.numpy()`` of a tensor made from constants gives its values, of its dtype; of any other tensor
    without values while dynamo traces, its dtype and shape only (``DtypeOnly``)."""
    values = known_values(instance)
    if values is not None:
        return values.astype(numpy_dtype(instance.dtype))
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as exc:
        if "not supported for tensor subclasses" not in str(exc):
            raise
        frame = model_frame_outside_torch()
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "the model"
        if not shape_is_static(instance):
            raise UnsupportedPattern(_leaves_torch(where, instance)) from exc
    return DtypeOnly(instance, where)


def _leaves_torch(where: str, tensor) -> str:
    """A tensor sized by the inputs goes to numpy: what follows (torchcrepe's Viterbi decode) runs outside
    torch. Said here, at the model's line; torch.onnx may still retry in strict mode, whose dynamo follows
    simple numpy, and this error is the one reported only when that fails too."""
    return (f"{where}: .numpy() of a tensor of shape {tuple(tensor.shape)} computed from the inputs: the model "
            f"leaves torch for numpy here, where the exporter cannot follow it at a dynamic size. Keep that step "
            f"outside the exported model (export the part before it), or write it with torch ops")


def shape_is_static(tensor) -> bool:
    return all(isinstance(d, int) for d in tensor.shape)


def _read(wrapped, instance, args, kwargs):
    values = known_values(instance)
    if values is None and wrapped.__name__ == "tolist" and index_lists.kept(instance, args, kwargs):
        return instance  # indices of a data-dependent count, a list only to index with (index_lists.py)
    if values is None or args or kwargs or (wrapped.__name__ != "tolist" and values.size != 1):
        return wrapped(*args, **kwargs)
    return _READERS[wrapped.__name__](values)


def _constant_key(key) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    return all(p is None or p is Ellipsis or (isinstance(p, int) and not isinstance(p, bool))
               or (isinstance(p, slice) and _is_constant([p.start, p.stop, p.step])) for p in parts)


def _traced_call(wrapped, instance, args, kwargs):
    """The non-strict exporter's torch function handler sees ``tensor[key]``, which cannot be wrapped on
    ``torch.Tensor`` itself (see the targets): indexing a known tensor with constants keeps it known."""
    result = wrapped(*args, **kwargs)
    func, call = args[0], (args[2] if len(args) > 2 else kwargs.get("args", ()))
    if getattr(func, "__name__", None) == "__getitem__" and len(call) == 2 and _constant_key(call[1]):
        values = known_values(call[0])
        if values is not None:
            _remember(result, values[call[1]])
    return result


_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _say_index_is_frozen(frame) -> None:
    """The tracer turns a tensor into a Python index silently: ``range(0, x.size(1), 4)`` (a size is a
    0-d tensor while TorchScript traces) unrolls a chunk loop at the example's count with no warning, and
    verification at another length then fails with nothing to name. Said as the TracerWarning the tracer
    gives for ``int()``, at the model's line (not for torch's own calls), so the pipeline names it."""
    if frame is None or os.path.abspath(frame.f_code.co_filename).startswith(_TORCH):
        return
    warnings.warn_explicit("Converting a tensor to a Python index (a loop's count, a list's length) might cause "
                           "the trace to be incorrect: its value at the example is unrolled into the graph",
                           torch.jit.TracerWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"))


def _constants(wrapped, instance, args, kwargs):
    padded = lengths.read(wrapped, instance, args, kwargs)  # a declared lengths input's longest (lengths.py)
    if padded is not None:
        return padded
    if torchscript_exporting():  # nothing to do there but keep the tracer's warnings at the model's line
        if wrapped.__name__ == "__index__":
            _say_index_is_frozen(model_frame())
        return said_at(model_frame(), wrapped, *args, **kwargs)
    name = wrapped.__name__
    if name == "__torch_function__":
        return _traced_call(wrapped, instance, args, kwargs)
    if name == "numpy":
        return _numpy(wrapped, instance, args, kwargs)
    if name in _READERS:
        return _read(wrapped, instance, args, kwargs)
    if instance is not None:
        return _derived(wrapped, instance, args, kwargs)
    return _factory(wrapped, instance, args, kwargs)


register(Patch(
    name="constant_values",
    description="tensors made from Python constants in forward (torch.arange(1, x.dim()).tolist(), "
                "int(torch.tensor(n))) give their values back while the dynamo exporter traces",
    # not Tensor.__getitem__: overriding it on torch.Tensor and deleting the override afterwards leaves the
    # type a sequence (CPython fills sq_item, which TensorBase lacks), and the TorchScript exporter then
    # fails on "len() of a 0-d tensor" in every later export of the process
    targets=("torch:arange", "torch:tensor", "torch:as_tensor", "torch:from_numpy",
             "torch:Tensor.long", "torch:Tensor.int", "torch:Tensor.cpu", "torch:Tensor.float",
             "torch:Tensor.tolist", "torch:Tensor.item",
             "torch:Tensor.__int__", "torch:Tensor.__index__", "torch:Tensor.__float__", "torch:Tensor.numpy",
             # the tensors the dynamo exporter traces with have their own tolist
             "torch._subclasses.fake_tensor:FakeTensor.tolist",
             "torch._subclasses.functional_tensor:FunctionalTensor.tolist",
             "torch._export.non_strict_utils:_NonStrictTorchFunctionHandler.__torch_function__"),
    optional=("torch._subclasses.fake_tensor:FakeTensor.tolist",
              "torch._subclasses.functional_tensor:FunctionalTensor.tolist"),
    on_import=("torch._export.non_strict_utils:_NonStrictTorchFunctionHandler.__torch_function__",),
    wrapper=_constants,
    when="export",
    aliases=False,
))


# --- buffers read back as numbers (second sweep) --------------------------------------------------------------
# A model reads a small buffer as a Python value: speechtokenizer's codebook ``if self.inited:``, pesto's
# ``round(self.shift.cpu().item() * bins)``. The TorchScript exporter reads the buffer's value (right: the
# buffer is a constant of the graph); the non-strict dynamo exporter swaps every buffer for a fake tensor
# (``torch.nn.utils.stateless._reparametrize_module``), so the read stops the export ("Could not guard on
# data-dependent expression", measured on torch 2.13). When that swap happens, each small buffer's values
# (up to 4096) are kept beside the fake that replaces it, and the readers above (and ``bool()``, see
# ``checks.py``) return them: the graph holds what the TorchScript exporter would.


def _real(tensor) -> bool:
    return type(tensor) in (torch.Tensor, torch.nn.Parameter)


def _values_of(tensor: torch.Tensor):
    """A real CPU tensor's values, read outside the exporter's fake mode and torch function handler (both
    already active when the buffers are swapped)."""
    if tensor.device.type != "cpu" or tensor.requires_grad:
        return None
    unset_fake = getattr(torch._subclasses.fake_tensor, "unset_fake_temporarily", contextlib.nullcontext)
    try:
        with unset_fake(), torch._C.DisableTorchFunction():
            return tensor.detach().numpy().copy()
    except (RuntimeError, TypeError):
        return None


def _buffer_values(wrapped, instance, args, kwargs):
    module = args[0] if args else kwargs.get("module")
    replacements = args[1] if len(args) > 1 else kwargs.get("parameters_and_buffers", {})
    if isinstance(module, torch.nn.Module) and isinstance(replacements, dict):
        buffers = dict(module.named_buffers(remove_duplicate=False))
        for name, new in replacements.items():
            old = buffers.get(name)
            if old is None or not isinstance(new, torch.Tensor) or old.numel() > _MAX_VALUES or old.is_complex():
                continue
            values = _values_of(old) if _real(old) else known_values(old)
            if values is not None:
                _remember(new, values)
    idle("buffer_values")  # it only records; the readers' patches act when a value is read
    return wrapped(*args, **kwargs)


register(Patch(
    name="buffer_values",
    description="a small buffer read back as a number (if self.inited:, self.shift.item()) gives its value while "
                "the dynamo exporter traces, as under TorchScript",
    targets=("torch.nn.utils.stateless:_reparametrize_module",),
    wrapper=_buffer_values,
    when="always",  # the swap comes before the exporter says it is exporting; it only records values
    aliases=False,
    requires=("constant_values",),
))
