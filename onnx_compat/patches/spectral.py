"""STFT, ISTFT and FFT with complex values, under both exporters.

Measured on torch 2.13 (issue #13): the TorchScript exporter writes nothing
complex ("STFT does not currently support complex types", "Exporting the
operator 'aten::fft_rfft' ... is not supported"); the dynamo exporter writes
``stft -> abs`` but its ``angle`` is off by 2π where the spectrum is real and
negative, ``irfft(rfft(x))`` fails in ONNX Runtime ("Shape mismatch attempting
to re-use buffer"), ``istft(stft(x))`` does not export, and neither does
``mag * (cos(p) + 1j * sin(p))`` ("No ONNX function found for
aten.mul.Scalar").

While exporting, the calls that make a complex tensor return a
``ComplexPair`` (``_complex.py``) and every transform is a product with cosine
and sine tables (``_dft.py``): ``conv1d`` for the STFT, ``conv_transpose1d``
for the ISTFT, ``matmul`` for the FFTs. Real ops only, so both exporters write
them and ONNX Runtime runs them at any length. The model's code is unchanged;
the pair exists only during the export. Calls with no real-valued form (a
complex input signal, ``istft(..., return_complex=True)``, a complex tensor
made some other way) raise ``SpectralError`` naming the call.

Both exporters get these patches: dynamo's own complex support is partial, and
whether a spectrum is only used by ``abs`` is not known when it is made.
"""
from __future__ import annotations

import numbers
import warnings

import torch

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches import _dft
from onnx_compat.patches._calls import tensor_call
from onnx_compat.patches._complex import _REAL, ComplexPair, SpectralError, _name, _parts, mul, op, unsupported
from onnx_compat.patches._static import static_ints

__all__ = ["ComplexPair", "SpectralError"]

_STFT_PARAMS = ("input", "n_fft", "hop_length", "win_length", "window", "center", "pad_mode", "normalized",
                "onesided", "return_complex", "align_to_window")
_STFT_DEFAULTS = {"hop_length": None, "win_length": None, "window": None, "center": True, "pad_mode": "reflect",
                  "normalized": False, "onesided": None, "return_complex": None, "align_to_window": None}
_PAD_MODES = ("reflect", "constant", "replicate", "circular")


def _is_size(value) -> bool:
    """A length argument: an int, or a traced size (``x.shape[-1]`` while exporting)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and not value.is_complex()
    return isinstance(value, getattr(torch, "SymInt", ()))


def constant_size(value):
    """A 0-d integer tensor as a Python int; anything else unchanged.

    The TorchScript exporter traces sizes as 0-d tensors, so ``n_fft = 2 *
    (spec.shape[-2] - 1)`` reaches ``istft`` as one. The transform's size
    (``n_fft``, hop, window length) sets the shape of its tables, so it is a
    constant of the export whatever made it.
    """
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (value.is_floating_point()
                                                                      or value.is_complex()
                                                                      or value.dtype == torch.bool):
        return static_ints([value])[0]
    return value


def _frame_args(call: str, n_fft, hop_length, win_length, window, like):
    """``(hop, window of n_fft samples)``, or None when PyTorch itself rejects the arguments."""
    if isinstance(window, ComplexPair) or (isinstance(window, torch.Tensor) and window.is_complex()):
        raise unsupported(f"{call}(window=...)", "a complex window")
    n_fft, hop_length, win_length = (constant_size(v) for v in (n_fft, hop_length, win_length))
    if not isinstance(n_fft, int) or n_fft <= 0:
        return None
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    if not isinstance(hop, int) or not isinstance(win, int) or hop <= 0 or not 0 < win <= n_fft:
        return None
    if window is not None:
        if not isinstance(window, torch.Tensor) or window.dim() != 1 or static_ints(window.shape) != (win,):
            return None
    return hop, _dft.full_window(window, n_fft, win, like)


def _stft(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, _STFT_PARAMS, _STFT_DEFAULTS)
    if b is None:
        return wrapped(*args, **kwargs)
    x = b["input"]
    if isinstance(x, ComplexPair) or (isinstance(x, torch.Tensor) and x.is_complex()):
        raise unsupported("torch.stft(input=...)", "a complex input signal")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() not in (1, 2) \
            or b["return_complex"] is None or b["pad_mode"] not in _PAD_MODES \
            or (b["center"] and b["align_to_window"] is not None):
        return wrapped(*args, **kwargs)  # PyTorch's own error
    framing = _frame_args("torch.stft", b["n_fft"], b["hop_length"], b["win_length"], b["window"], x)
    if framing is None:
        return wrapped(*args, **kwargs)
    hop, window = framing
    n_fft = constant_size(b["n_fft"])
    left = right = 0
    if b["align_to_window"] and not b["center"]:
        win = constant_size(b["win_length"]) or n_fft
        left = (n_fft - win) // 2
        right = n_fft - win - left
    onesided = True if b["onesided"] is None else bool(b["onesided"])
    re, im = _dft.stft(x, n_fft, hop, window, bool(b["center"]), b["pad_mode"], bool(b["normalized"]),
                       onesided, left, right)
    if b["return_complex"]:
        return ComplexPair(re, im)
    return torch.stack([re, im], -1)


@op("istft")
def istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False,
          onesided=None, length=None, return_complex=False):
    """``torch.istft`` of a ``ComplexPair`` spectrum."""
    if return_complex:
        raise unsupported("torch.istft(return_complex=True)", "a complex output signal")
    if input.dim() not in (2, 3):
        raise SpectralError(f"torch.istft: expected a 2D or 3D complex spectrum, got {input.dim()}D")
    framing = _frame_args("torch.istft", n_fft, hop_length, win_length, window, input.real)
    if framing is None:
        raise SpectralError(f"torch.istft: invalid n_fft={n_fft!r}, hop_length={hop_length!r}, "
                            f"win_length={win_length!r} or window for this call")
    hop, full = framing
    n_fft = constant_size(n_fft)
    (bins,) = static_ints(input.shape[-2:-1])
    onesided = bins != n_fft if onesided is None else bool(onesided)
    expected = n_fft // 2 + 1 if onesided else n_fft
    if bins != expected:
        raise SpectralError(f"torch.istft: the spectrum has {bins} frequency bins; n_fft={n_fft} with "
                            f"onesided={onesided} needs {expected}")
    if length is not None and not _is_size(length):
        raise SpectralError(f"torch.istft: length={length!r} is not a positive size")
    if window is None:
        warnings.warn("torch.istft without a window uses a rectangular one, as PyTorch does", stacklevel=3)
    return _dft.istft(input.real, input.imag, n_fft, hop, full, bool(center), bool(normalized), onesided, length)


def _fft_call(name: str, x, n, dim, norm):
    """``torch.fft.<name>`` of a real tensor or a pair along ``dim``."""
    if norm not in (None, "backward", "ortho", "forward"):
        raise SpectralError(f"torch.fft.{name}: norm={norm!r}; expected 'backward', 'ortho' or 'forward'")
    if n is not None and not _is_size(n):
        raise SpectralError(f"torch.fft.{name}: n={n!r} is not a positive size")
    re, im = _parts(x)
    if not isinstance(re, torch.Tensor):
        raise SpectralError(f"torch.fft.{name}: input must be a tensor, not {type(x).__name__}")
    if name == "rfft" and im is not None:
        raise SpectralError("torch.fft.rfft expects a real input tensor, got a complex one")
    last = re.dim() - 1
    axis = dim % re.dim()
    re = re.movedim(axis, last)
    im = None if im is None else im.movedim(axis, last)
    if name == "irfft":
        size = re.shape[-1]
        length = n if n is not None else 2 * (size - 1)
        bins = length // 2 + 1
        if n is not None or not isinstance(size, int):
            re = _dft.fit(re, bins)
            im = None if im is None else _dft.fit(im, bins)
        out = _dft.irfft(re, re * 0 if im is None else im, length, norm)
        return out.movedim(last, axis)
    length = n if n is not None else re.shape[-1]
    if n is not None:
        re = _dft.fit(re, n)
        im = None if im is None else _dft.fit(im, n)
    if name == "rfft":
        out = _dft.rfft(re, length, norm)
    else:
        out = _dft.fft(re, im, length, norm, inverse=name == "ifft")
    return ComplexPair(out[0].movedim(last, axis), out[1].movedim(last, axis))


def _fft_op(name: str):
    def apply(input, n=None, dim=-1, norm=None, **kwargs):
        if kwargs:
            raise unsupported(f"torch.fft.{name}", f"keyword arguments {sorted(kwargs)}")
        return _fft_call(name, input, n, dim, norm)
    return apply


def _fft(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "n", "dim", "norm"), {"n": None, "dim": -1, "norm": None})
    if b is None or isinstance(b["input"], torch.Tensor) and not (b["input"].is_floating_point()
                                                                 or b["input"].is_complex()):
        return wrapped(*args, **kwargs)  # PyTorch's own error, or its promotion of integer input
    return _fft_call(_name(wrapped)[len("fft_"):], b["input"], b["n"], b["dim"], b["norm"])


for _kind in ("fft", "ifft", "rfft", "irfft"):
    op(f"fft_{_kind}")(_fft_op(_kind))


def _polar(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("abs", "angle"))
    if b is None or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in b.values()):
        return wrapped(*args, **kwargs)
    return ComplexPair(b["abs"] * torch.cos(b["angle"]), b["abs"] * torch.sin(b["angle"]))


def _complex(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("real", "imag"))
    if b is None or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in b.values()) \
            or b["real"].dtype != b["imag"].dtype:
        return wrapped(*args, **kwargs)
    return ComplexPair(*torch.broadcast_tensors(b["real"], b["imag"]))


def _view_as_complex(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input",))
    x = None if b is None else b["input"]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0 \
            or static_ints(x.shape[-1:]) != (2,):
        return wrapped(*args, **kwargs)
    return ComplexPair(x[..., 0], x[..., 1])


def _make_complex(wrapped, instance, args, kwargs):
    return _MAKERS.get(_name(wrapped), _times_complex)(wrapped, instance, args, kwargs)


def _times_complex(wrapped, instance, args, kwargs):
    """``tensor * 1j`` and friends: a real tensor times a Python complex number."""
    operands = tuple(args) if instance is None else (instance,) + tuple(args)
    if kwargs or len(operands) != 2 or not any(isinstance(o, complex) for o in operands):
        return wrapped(*args, **kwargs)
    if not all(isinstance(o, (complex, numbers.Real)) or isinstance(o, torch.Tensor) and o.is_floating_point()
               for o in operands):
        return wrapped(*args, **kwargs)
    return mul(*operands)


def _cast_target(args, kwargs):
    """The dtype a ``Tensor.to``/``Tensor.type`` call casts to, when it names one."""
    named = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
    if named is None:
        named = next((a for a in args if isinstance(a, str) and "complex" in a), None)
    if isinstance(named, str):
        named = getattr(torch, named.replace("torch.", ""), None)
    if named is None:
        named = next((a.dtype for a in args if isinstance(a, (torch.Tensor, ComplexPair))), None)
    return named if isinstance(named, torch.dtype) else None


def _cast_to_complex(wrapped, instance, args, kwargs):
    """``x.to(torch.complex64)``, ``x.type(torch.cfloat)``, ``x.to(z)`` of a real tensor: the pair ``(x, 0)``."""
    target = _cast_target(args, kwargs)
    if not isinstance(instance, torch.Tensor) or instance.is_complex() or target not in _REAL:
        return wrapped(*args, **kwargs)
    real = instance.to(_REAL[target])
    return ComplexPair(real, torch.zeros_like(real))


_MAKERS = {"polar": _polar, "complex": _complex, "view_as_complex": _view_as_complex,
           "to": _cast_to_complex, "type": _cast_to_complex}


register(Patch(
    name="stft",
    description="torch.stft / Tensor.stft export under both exporters as one strided conv1d (all framing "
                "options; return_complex=True gives real/imaginary pairs that abs, angle, istft, ... accept)",
    targets=("torch:stft",),
    wrapper=_stft,
    when="export",
))

register(Patch(
    name="fft",
    description="torch.fft.fft/ifft/rfft/irfft export under both exporters as a matmul with cosine and sine "
                "tables (n= and norm= included)",
    targets=("torch:fft.fft", "torch:fft.ifft", "torch:fft.rfft", "torch:fft.irfft"),
    wrapper=_fft,
    when="export",
))

register(Patch(
    name="complex_values",
    description="torch.polar, torch.complex, torch.view_as_complex, a tensor times a Python complex "
                "number and a cast of a real tensor to a complex dtype (Tensor.to/.type) give real/imaginary "
                "pairs while exporting",
    targets=("torch:polar", "torch:complex", "torch:view_as_complex", "torch:mul", "torch:Tensor.mul",
             "torch:Tensor.__mul__", "torch:Tensor.__rmul__", "torch:Tensor.to", "torch:Tensor.type"),
    wrapper=_make_complex,
    when="export",
))


# --- complex buffers (issue #39, pattern 2) ----------------------------------------------------------
# Rotary embeddings keep their frequencies as a complex buffer made once with ``torch.polar`` and multiply a
# ``view_as_complex`` of the input by a slice of it. Under the spectral patches the input is a real/imaginary
# pair and the buffer a complex tensor, which the pair refused ("only complex values made by the patched calls
# can be used"; vanilla TorchScript: "Unknown number type: complex"). While TorchScript traces, a complex
# tensor read as a module attribute is handed over as a pair of real constants, made outside the trace.
# Under dynamo, which exports this model by itself, the non-strict trace reads buffers without
# Module.__getattr__: the complex tensor meets the pair in its arithmetic, which takes the tensor's parts in
# the graph (``_complex._graph_parts``).


def _complex_attribute(wrapped, instance, args, kwargs):
    value = wrapped(*args, **kwargs)
    if not isinstance(value, torch.Tensor) or not value.is_complex():
        return value
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        real, imag = value.real.detach().clone(), value.imag.detach().clone()
    finally:
        torch._C._set_tracing_state(state)
    return ComplexPair(real, imag)


register(Patch(
    name="complex_buffers",
    description="a complex buffer or parameter (rotary frequencies made with torch.polar) read while TorchScript "
                "traces is a real/imaginary pair of constants, as the spectral patches' complex values are",
    targets=("torch.nn.modules.module:Module.__getattr__",),
    wrapper=_complex_attribute,
    when="torchscript",
    aliases=False,
    requires=("complex_values",),
))
