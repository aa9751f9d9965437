"""Complex values as a pair of real tensors while an export traces the model.

ONNX has no complex arithmetic that both exporters write and ONNX Runtime runs
(issue #13), yet models make complex spectra in ``forward`` and take their
``abs``, ``angle`` or ``istft``. Under the ``spectral`` patches the calls that
make a complex tensor return a ``ComplexPair`` instead: two real tensors the
exporters trace like any others. It takes part in torch's ``__torch_function__``
protocol, so ``torch.abs(z)``, ``z.abs()``, ``z * mask``, ``torch.istft(z, ...)``
or ``torch.cat([z1, z2])`` reach the table below, written with real ops. A
call the table does not know raises ``SpectralError`` naming it, rather than
tracing something wrong. The pair never exists outside an export.
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from onnx_compat.errors import SpectralError
from onnx_compat.patches import complex_sites


_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128, torch.float16: torch.complex32}
_REAL = {v: k for k, v in _COMPLEX.items()}
_OPS: Dict[str, Callable] = {}


def _name(func) -> str:
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return getattr(func, "__name__", repr(func))


def unsupported(call: str, why: str) -> SpectralError:
    return SpectralError(f"{complex_sites.model_site()}{call}: {why}. While exporting, complex tensors travel "
                         f"as real/imaginary pairs (onnx_compat's spectral patches); this call has no such form"
                         f"{complex_sites.further_on()}")


class ComplexPair:
    """A complex tensor as ``real`` and ``imag`` real tensors of one shape."""

    __slots__ = ("real", "imag")

    def __init__(self, real: torch.Tensor, imag: torch.Tensor) -> None:
        self.real, self.imag = real, imag

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = _name(func)
        impl = _OPS.get(name)
        if impl is None:
            raise unsupported(f"torch {name}", "this operation on a complex tensor is not supported")
        return impl(*args, **(kwargs or {}))

    def __getattr__(self, name: str):
        if name in _OPS:
            return functools.partial(_OPS[name], self)
        if name.startswith("__") or not hasattr(torch.Tensor, name):
            raise AttributeError(name)
        raise unsupported(f"Tensor.{name}", "this operation on a complex tensor is not supported")

    @property
    def shape(self) -> torch.Size:
        return self.real.shape

    @property
    def dtype(self) -> torch.dtype:
        return _COMPLEX.get(self.real.dtype, self.real.dtype)

    @property
    def device(self) -> torch.device:
        return self.real.device

    @property
    def ndim(self) -> int:
        return self.real.dim()

    @property
    def requires_grad(self) -> bool:
        return self.real.requires_grad or self.imag.requires_grad

    def dim(self) -> int:
        return self.real.dim()

    ndimension = dim

    def stride(self, dim: Optional[int] = None):
        """The parts' strides, in elements, as a complex tensor's are (both parts laid out alike)."""
        _same_layout(self, "Tensor.stride")
        return self.real.stride() if dim is None else self.real.stride(dim)

    def size(self, dim: Optional[int] = None):
        return self.real.size() if dim is None else self.real.size(dim)

    def numel(self) -> int:
        return self.real.numel()

    def is_complex(self) -> bool:
        return True

    def is_floating_point(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self.real)

    def __repr__(self) -> str:
        return f"ComplexPair(shape={tuple(self.shape)}, dtype={self.dtype})"


# Code that picks an array library by the class's module (``{"numpy": np, "torch": torch}[type(x).__module__]``,
# nara-wpe's ``segment_axis``) must pick torch for the pair, which stands for a torch tensor.
ComplexPair.__module__ = "torch"


def _same_layout(z: ComplexPair, call: str) -> None:
    if tuple(z.real.stride()) != tuple(z.imag.stride()) or z.real.storage_offset() != z.imag.storage_offset():
        raise unsupported(call, "its real and imaginary parts are laid out differently in memory")


def op(*names: str):
    def register(fn):
        for n in names:
            _OPS[n] = fn
        return fn
    return register


def _dynamo_exporting() -> bool:
    from onnx_compat.patches.when import dynamo_exporting
    return dynamo_exporting()


def _graph_parts(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """A complex tensor the dynamo exporter traces by itself (a complex buffer: rotary frequencies made with
    ``torch.polar`` in ``__init__``) meeting a pair: its parts through ``view_as_real``, which the exporter
    writes (``x.real``/``x.imag`` of a traced buffer fail to decompose, measured on torch 2.13)."""
    parts = torch.view_as_real(x)
    return parts[..., 0], parts[..., 1]


def _parts(x) -> Tuple[object, Optional[object]]:
    """``(real, imag)`` of an operand; imag None when it is real."""
    if isinstance(x, ComplexPair):
        return x.real, x.imag
    if isinstance(x, complex):
        return x.real, x.imag
    if isinstance(x, torch.Tensor) and x.is_complex() and _dynamo_exporting():
        return _graph_parts(x)
    if isinstance(x, torch.Tensor) and x.is_complex():
        raise unsupported("a complex torch tensor operand",
                          "only complex values made by the patched calls (stft, fft, polar, complex, "
                          "view_as_complex, a tensor times a complex number, Tensor.to/type with a complex "
                          "dtype) can be used")
    if isinstance(x, (torch.Tensor, numbers.Real)):
        return x, None
    raise unsupported(f"an operand of type {type(x).__name__}", "not a number or tensor")


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _sub(a, b):
    return (None if b is None else -b) if a is None else a if b is None else a - b


def _mul(a, b):
    return None if a is None or b is None else a * b


def _pair(re, im) -> ComplexPair:
    if im is None:
        im = re * 0
    if re is None:
        re = im * 0
    return ComplexPair(re, im)


def mul(a, b) -> ComplexPair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(_sub(_mul(ar, br), _mul(ai, bi)), _add(_mul(ar, bi), _mul(ai, br)))


def div(a, b) -> ComplexPair:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if bi is None:
        return _pair(ar / br, None if ai is None else ai / br)
    denom = br * br + bi * bi
    return _pair(_add(_mul(ar, br), _mul(ai, bi)) / denom, _sub(_mul(ai, br), _mul(ar, bi)) / denom)


op("mul", "__mul__", "__rmul__", "multiply")(lambda a, b, **k: mul(a, b) if not k else _no_kw("mul", k))
op("div", "__truediv__", "divide", "true_divide")(lambda a, b, **k: div(a, b) if not k else _no_kw("div", k))
op("__rdiv__", "__rtruediv__")(lambda a, b: div(b, a))


def _no_kw(name, kwargs):
    raise unsupported(f"torch {name}", f"keyword arguments {sorted(kwargs)} are not supported")


@op("add", "__add__", "__radd__")
def _add_op(a, b, alpha=1):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if alpha != 1:
        br, bi = _mul(br, alpha), _mul(bi, alpha)
    return _pair(_add(ar, br), _add(ai, bi))


@op("sub", "__sub__", "subtract")
def _sub_op(a, b, alpha=1):
    return _add_op(a, b, -alpha)


@op("__rsub__")
def _rsub_op(a, b):
    return _add_op(b, a, -1)


@op("neg", "__neg__", "negative")
def _neg(z):
    return ComplexPair(-z.real, -z.imag)


@op("conj", "conj_physical")
def _conj(z):
    return ComplexPair(z.real, -z.imag)


op("resolve_conj", "resolve_neg", "positive", "__pos__")(lambda z: z)
op("real")(lambda z: z.real)
op("imag")(lambda z: z.imag)
op("is_complex")(lambda z: True)
op("view_as_real")(lambda z: torch.stack([z.real, z.imag], -1))


@op("abs", "absolute", "__abs__")
def _abs(z):
    return torch.sqrt(z.real * z.real + z.imag * z.imag)


def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``torch.atan2`` from ``atan``, with PyTorch's value on the negative real axis.

    Both exporters write ``atan2(0, x < 0)`` as -π (their quadrant test is
    ``y > 0``) where PyTorch gives π: measured on torch 2.13, the phase of
    every real negative DC or Nyquist bin came out 2π off.
    """
    base = torch.atan(y / torch.where(x == 0, torch.ones_like(x), x))
    left = torch.where(y >= 0, base + math.pi, base - math.pi)
    axis = torch.where(y > 0, math.pi / 2, torch.where(y < 0, -math.pi / 2, 0.0)).to(y.dtype)
    return torch.where(x > 0, base, torch.where(x < 0, left, axis))


@op("angle")
def _angle(z):
    # a signed zero imaginary part (-0.0) counts as +0.0, as PyTorch's FFT writes it
    return atan2(z.imag, z.real)


@op("exp")
def _exp(z):
    m = torch.exp(z.real)
    return ComplexPair(m * torch.cos(z.imag), m * torch.sin(z.imag))


@op("pow", "__pow__", "float_power")
def _pow(z, exponent):
    if not isinstance(exponent, int) or isinstance(exponent, bool) or not 0 < exponent <= 8:
        raise unsupported("a complex tensor ** exponent", f"only integer exponents 1..8, not {exponent!r}")
    out = z
    for _ in range(exponent - 1):
        out = mul(out, z)
    return out


@op("matmul", "__matmul__")
def _matmul(a, b):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return _pair(_sub(ar @ br, None if ai is None or bi is None else ai @ bi),
                 _add(None if bi is None else ar @ bi, None if ai is None else ai @ br))


@op("__rmatmul__")
def _rmatmul(a, b):
    return _matmul(b, a)


@op("einsum")
def _einsum(equation, *operands):
    """``torch.einsum`` is linear in each operand: the product of ``n`` complex operands expands into the
    ``2**n`` einsums of their parts, each imaginary part a factor ``i`` (DeepFilterNet's deep filter,
    df/multiframe.py:136: ``einsum("...tfn,...ntf->...tf", spec, coefs)``, both complex). Up to 4 operands."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or not 1 <= len(operands) <= 4:
        raise unsupported("torch einsum", "only an equation string and 1 to 4 operands")
    parts = [_parts(x) for x in operands]
    re = im = None
    for choice in itertools.product((0, 1), repeat=len(parts)):
        factors = [p[c] for p, c in zip(parts, choice)]
        if any(f is None for f in factors):
            continue  # the imaginary part of a real operand
        term = torch.einsum(equation, *factors)
        k = sum(choice)  # i ** k: real when k is even, imaginary when odd; negative when k % 4 is 2 or 3
        term = -term if k % 4 >= 2 else term
        re, im = (_add(re, term), im) if k % 2 == 0 else (re, _add(im, term))
    return _pair(re, im)


def _both(name: str):
    """An op that acts on real and imaginary parts alike (shape changes, reductions)."""
    def apply(z, *args, **kwargs):
        return ComplexPair(getattr(z.real, name)(*args, **kwargs), getattr(z.imag, name)(*args, **kwargs))
    return apply


for _n in ("__getitem__", "transpose", "permute", "unsqueeze", "squeeze", "reshape", "view", "flatten",
           "unflatten", "contiguous", "clone", "detach", "movedim", "moveaxis", "narrow", "flip", "roll",
           "expand", "expand_as", "repeat", "swapaxes", "swapdims", "select", "sum", "mean", "reshape_as",
           "view_as", "squeeze_", "unsqueeze_", "unfold"):
    op(_n)(_both(_n))


@op("as_strided")
def _as_strided(z, size, stride, storage_offset=None):
    """A strided view (framing) of each part, as the model's own call on a real tensor exports
    (``shape_ops.strided_view``): the strides count elements, the same for a part as for the complex tensor."""
    from onnx_compat.patches.shape_ops import strided_view
    _same_layout(z, "torch as_strided")
    return ComplexPair(strided_view(z.real, size, stride, storage_offset),
                       strided_view(z.imag, size, stride, storage_offset))


def _like(fill):
    """A pair of zeros (or ones + 0j); a real dtype asked for gives that real tensor, as torch does."""
    def apply(z, *args, **kwargs):
        dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
        if dtype is not None and dtype not in _REAL:
            return fill(z.real, *args, **kwargs)
        args = tuple(_REAL.get(a, a) if isinstance(a, torch.dtype) else a for a in args)
        kwargs = {k: (_REAL.get(v, v) if k == "dtype" else v) for k, v in kwargs.items()}
        return ComplexPair(fill(z.real, *args, **kwargs), torch.zeros_like(z.imag, *args, **kwargs))
    return apply


op("zeros_like")(_like(torch.zeros_like))
op("ones_like")(_like(torch.ones_like))


def _linear_into(name: str):
    """``z.<name>(dim, index, src)`` (scatter_add, index_add and their in-place forms): linear in ``z`` and
    ``src``, so each part takes the matching part of ``src`` (0 for a real one)."""
    def apply(z, dim, index, src, *args, **kwargs):
        src_re, src_im = _parts(src)
        src_im = src_re * 0 if src_im is None else src_im
        re = getattr(z.real, name)(dim, index, src_re, *args, **kwargs)
        im = getattr(z.imag, name)(dim, index, src_im, *args, **kwargs)
        return z if name.endswith("_") else ComplexPair(re, im)
    return apply


def _fill(name: str):
    """``index_fill``/``masked_fill`` with a number: the real part takes its real part, the imaginary its imaginary."""
    def apply(z, dim_or_mask, *rest):
        *head, value = rest
        re, im = _parts(value)
        if isinstance(re, torch.Tensor) or isinstance(im, torch.Tensor):
            raise unsupported(f"Tensor.{name} of a complex tensor", "only a number as the value")
        out_re = getattr(z.real, name)(dim_or_mask, *head, re)
        out_im = getattr(z.imag, name)(dim_or_mask, *head, 0.0 if im is None else im)
        return z if name.endswith("_") else ComplexPair(out_re, out_im)
    return apply


for _n in ("scatter_add", "scatter_add_", "index_add", "index_add_"):
    op(_n)(_linear_into(_n))
for _n in ("index_fill", "index_fill_", "masked_fill", "masked_fill_"):
    op(_n)(_fill(_n))


def _split(name: str):
    def apply(z, *args, **kwargs):
        re, im = getattr(z.real, name)(*args, **kwargs), getattr(z.imag, name)(*args, **kwargs)
        return tuple(ComplexPair(r, i) for r, i in zip(re, im))
    return apply


for _n in ("chunk", "split", "unbind", "tensor_split"):
    op(_n)(_split(_n))


def _joiner(fn):
    def apply(tensors, dim=0):
        parts = [_parts(t) for t in tensors]
        re = [r for r, _ in parts]
        im = [i if i is not None else r * 0 for r, i in parts]
        return ComplexPair(fn(re, dim), fn(im, dim))
    return apply


op("cat", "concat", "concatenate")(_joiner(torch.cat))
op("stack")(_joiner(torch.stack))


@op("pad")
def _pad(z, pad, mode="constant", value=None):
    """Every mode moves or repeats elements (reflect, replicate, circular) or fills a constant: part by part,
    a complex fill split into its parts."""
    if mode != "constant":
        return ComplexPair(F.pad(z.real, pad, mode=mode), F.pad(z.imag, pad, mode=mode))
    fill = complex(value or 0)
    return ComplexPair(F.pad(z.real, pad, value=fill.real), F.pad(z.imag, pad, value=fill.imag))


@op("to", "type")
def _to(z, *args, **kwargs):
    dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
    if dtype is not None:
        if dtype not in _REAL:
            raise unsupported("Tensor.to of a complex tensor", f"dtype {dtype} drops the imaginary part")
        args = tuple(_REAL[dtype] if a is dtype else a for a in args)
        kwargs = {k: (_REAL[v] if k == "dtype" else v) for k, v in kwargs.items()}
    return ComplexPair(z.real.to(*args, **kwargs), z.imag.to(*args, **kwargs))


def _operator(name: str):
    def apply(self, *args):
        return _OPS[name](self, *args)
    apply.__name__ = name
    return apply


# Python looks operators up on the type, never through __getattr__
for _n in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
           "__matmul__", "__rmatmul__", "__neg__", "__pos__", "__abs__", "__pow__", "__getitem__"):
    setattr(ComplexPair, _n, _operator(_n))
