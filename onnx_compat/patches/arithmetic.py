"""Single ops the TorchScript exporter cannot write, written with ops it can.

Each failure measured on torch 2.13.

``expm1`` (either exporter)
    TorchScript: "Exporting the operator 'aten::expm1' ... is not supported"
    (HiFi-GAN duration predictors). dynamo writes ``Exp(x) - 1``, which loses
    the digits of small arguments (float32 relative error 2e-5 at x = 1e-3,
    4.6 % at 1e-6, measured against eager ``expm1``). Near 0 Kahan's ``(u - 1) · x / log(u)`` keeps them: within a few
    float32 ulps of eager ``expm1`` everywhere.
``cumsum_small_ints``
    ``cumsum`` of a bool (or int8/uint8/int16) tensor exports, and ONNX Runtime
    refuses to load the graph (ONNX ``CumSum`` has no bool type). PyTorch
    promotes those to int64, so the input is cast to int64 first: same dtype,
    same values.
``vdot_real``
    ``torch.vdot`` (``parametrizations.spectral_norm`` computes sigma with it)
    has no export; for real tensors it is ``(a * b).sum()``.

``diff``
    ``torch.diff`` ("Exporting the operator 'aten::diff' ... is not
    supported"; transformers' masking utilities call it): ``prepend``/
    ``append`` concatenated, then ``n`` times ``x[1:] - x[:-1]`` along ``dim``,
    as slices that keep a dynamic length.

``logcumsumexp``
    ``torch.logcumsumexp`` ("Exporting the operator 'aten::logcumsumexp' ...
    is not supported"; minGRU/minLSTM's log-space parallel scan): the maximum
    along ``dim`` subtracted, ``log(cumsum(exp(x - max))) + max`` in float64, so
    a prefix far below the maximum (log-space scans grow along time) does not
    underflow to ``-inf`` while the values along ``dim`` span less than ~700.

The dynamo exporter writes the last four right, so they act under TorchScript only.

``amax_amin_all``
    ``x.amax()`` / ``x.amin()`` with no dim (a peak normalisation, ``y / y.abs().amax()``): the dynamo exporter
    fails to translate it ("Required parameter 'dim' is not provided", onnxscript's ``aten_amax``; measured on
    torch 2.13); TorchScript writes it. Every dim named is the same reduction.
``builtin_max_min``
    Python's ``max(t)`` / ``min(t)`` over a 1-D tensor (``assert max(lengths) <= N``, torch-struct's
    ``_check_potentials``): torch.export's non-strict capture replaces the builtins while it traces and hands
    a lone tensor to ``torch.maximum(t)`` / ``torch.minimum(t)``, which take two ("maximum() missing 1 required
    positional arguments: 'other'", torch 2.13 ``_tensor_min_max``). Python's answer, the largest (smallest)
    element, is ``t.max()`` (``t.min()``); any other call of the two is left as it is.
"""
from __future__ import annotations

import torch

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._calls import tensor_call
from onnx_compat.patches._static import static_ints

_NEAR_ZERO = 0.5


def expm1(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) - 1``, accurate near 0 too.

    Near 0 Kahan's form ``(u - 1) · x / log(u)`` with ``u = exp(x)``: the rounding
    of ``u`` cancels between numerator and denominator (``x`` itself where ``u``
    rounds to 1). Elsewhere ``exp(x) - 1`` loses nothing.
    """
    u = torch.exp(x)
    d = u - 1.0
    near = torch.where(d == 0, x, d * x / torch.log(u))
    return torch.where(x.abs() < _NEAR_ZERO, near, d)


def _expm1(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input",))
    if b is None or not isinstance(b["input"], torch.Tensor) or not b["input"].is_floating_point():
        return wrapped(*args, **kwargs)
    return expm1(b["input"])


_PROMOTED = (torch.bool, torch.uint8, torch.int8, torch.int16)


def _cumsum(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "dim", "dtype"), {"dtype": None})
    if b is None or b["dtype"] is not None or b["input"].dtype not in _PROMOTED:
        return wrapped(*args, **kwargs)
    return torch.cumsum(b["input"].to(torch.int64), b["dim"])


def _vdot(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "other"))
    if b is None or b["input"].is_complex() or b["other"].is_complex() or b["input"].dim() != 1:
        return wrapped(*args, **kwargs)
    # vector lengths are weight sizes here: compared as ints, without a "baked" TracerWarning
    if static_ints(b["input"].shape) != static_ints(b["other"].shape) or b["input"].dtype != b["other"].dtype:
        return wrapped(*args, **kwargs)  # PyTorch's own error
    return (b["input"] * b["other"]).sum()


def diff(x, n=1, dim=-1, prepend=None, append=None):
    """``torch.diff`` as concatenation and slices."""
    if n == 0:
        return x  # PyTorch ignores prepend/append then
    dim = dim % x.dim()
    parts = [t for t in (prepend, x, append) if t is not None]
    if len(parts) > 1:
        x = torch.cat(parts, dim)
    before = (slice(None),) * dim
    for _ in range(n):
        if x.dtype == torch.bool:
            x = x[before + (slice(1, None),)] != x[before + (slice(None, -1),)]
        else:
            x = x[before + (slice(1, None),)] - x[before + (slice(None, -1),)]
    return x


def _diff(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "n", "dim", "prepend", "append"),
                    {"n": 1, "dim": -1, "prepend": None, "append": None})
    if b is None or not isinstance(b["n"], int) or b["n"] < 0 or b["input"].dim() == 0 \
            or any(t is not None and (not isinstance(t, torch.Tensor) or t.dim() != b["input"].dim())
                   for t in (b["prepend"], b["append"])):
        return wrapped(*args, **kwargs)  # PyTorch's own error (or a scalar prepend it broadcasts)
    return diff(b["input"], b["n"], b["dim"], b["prepend"], b["append"])


def logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``torch.logcumsumexp`` as Exp, CumSum and Log, shifted by the maximum along ``dim`` (a -inf or inf
    maximum shifts by 0, so -inf rows stay -inf and inf propagates as in eager)."""
    wide = x.to(torch.float64)
    top = wide.amax(dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (torch.log(torch.cumsum(torch.exp(wide - top), dim)) + top).to(x.dtype)


def reduce_all(wrapped, instance, args, kwargs):
    """``amax``/``amin`` over no dim given: over every dim, named (a 0-d input is its own maximum). ``amax`` is
    ``padded_lengths``' target too (the longest of a lengths input), which hands it here for any other tensor."""
    bound = tensor_call(instance, args, kwargs, ("input", "dim", "keepdim"), {"dim": (), "keepdim": False})
    x = None if bound is None else bound["input"]
    reduce = {"amax": torch.amax, "amin": torch.amin}.get(wrapped.__name__)
    if reduce is None or not isinstance(x, torch.Tensor) or bound["dim"] not in ((), []) or x.dim() == 0:
        return wrapped(*args, **kwargs)
    return reduce(x, dim=tuple(range(x.dim())), keepdim=bound["keepdim"])


def single_tensor_extreme(wrapped, instance, args, kwargs):
    """``torch.maximum(t)`` / ``torch.minimum(t)`` with one 1-D tensor, which torch refuses: what the non-strict
    capture makes of Python's ``max(t)`` / ``min(t)``, whose answer is the extreme element. ``maximum`` is
    ``padded_lengths``' target too (``max(lengths)`` of a lengths input), which hands it here for any other tensor."""
    extreme = {"maximum": torch.Tensor.max, "minimum": torch.Tensor.min}.get(wrapped.__name__)
    lone = len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor)
    if extreme is None or not lone or args[0].dim() != 1:
        return wrapped(*args, **kwargs)
    return extreme(args[0])


def _logcumsumexp(wrapped, instance, args, kwargs):
    b = tensor_call(instance, args, kwargs, ("input", "dim"))
    if b is None or not isinstance(b["dim"], int) or not b["input"].is_floating_point() or b["input"].dim() == 0:
        return wrapped(*args, **kwargs)  # PyTorch's own error (a named dim, out=, an integer tensor)
    return logcumsumexp(b["input"], b["dim"])


def _integral(value) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool)
    return isinstance(value, int) and not isinstance(value, bool)


def _integral_data(value) -> bool:
    """An integer tensor of data (lengths, counts), not a traced 0-d size: size arithmetic is left as the
    exporter writes it (a floor correction on every ``T // n`` would grow every graph for shapes that are
    never negative)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and _integral(value)


def _floor_divide(wrapped, instance, args, kwargs):
    """Integer ``a // b``: PyTorch floors, the TorchScript exporter's ``Div`` truncates; they differ on negative
    quotients (a length formula ``(T - k) // s`` on a sequence shorter than the receptive field). ``torch.div``
    with ``rounding_mode="floor"`` exports the floor."""
    b = tensor_call(instance, args, kwargs, ("input", "other"))
    if b is None or not (_integral(b["input"]) and _integral(b["other"])) or \
            not (_integral_data(b["input"]) or _integral_data(b["other"])):
        return wrapped(*args, **kwargs)
    return torch.div(b["input"], b["other"], rounding_mode="floor")


def _rfloor_divide(wrapped, instance, args, kwargs):
    """``number // tensor``, the same rule."""
    if len(args) != 1 or kwargs or not (_integral_data(instance) and _integral(args[0])):
        return wrapped(*args, **kwargs)
    return torch.div(torch.as_tensor(args[0], dtype=instance.dtype), instance, rounding_mode="floor")


register(Patch(
    name="expm1",
    description="torch.expm1 / Tensor.expm1 export under TorchScript and keep their precision near 0 under "
                "both exporters (Kahan's form near 0)",
    targets=("torch:expm1", "torch:Tensor.expm1"),
    wrapper=_expm1,
    when="export",
))

register(Patch(
    name="cumsum_small_ints",
    description="cumsum of bool/int8/uint8/int16 tensors loads in ONNX Runtime after a TorchScript export "
                "(cast to int64 first, as PyTorch promotes them)",
    targets=("torch:cumsum", "torch:Tensor.cumsum"),
    wrapper=_cumsum,
    when="torchscript",
))

register(Patch(
    name="vdot_real",
    description="torch.vdot of real vectors exports under TorchScript (spectral_norm's sigma)",
    targets=("torch:vdot", "torch:Tensor.vdot"),
    wrapper=_vdot,
    when="torchscript",
))

register(Patch(
    name="diff",
    description="torch.diff / Tensor.diff export under TorchScript (slices and a subtraction; n, dim, "
                "prepend and append)",
    targets=("torch:diff", "torch:Tensor.diff"),
    wrapper=_diff,
    when="torchscript",
))

register(Patch(
    name="logcumsumexp",
    description="torch.logcumsumexp / Tensor.logcumsumexp export under TorchScript (shifted Exp, CumSum, Log in "
                "float64: minGRU's log-space scan)",
    targets=("torch:logcumsumexp", "torch:Tensor.logcumsumexp"),
    wrapper=_logcumsumexp,
    when="torchscript",
))

register(Patch(
    name="amax_amin_all",
    description="amax()/amin() with no dim export under dynamo (every dim named: onnxscript's aten_amax takes no "
                "default dim)",
    targets=("torch:amin", "torch:Tensor.amin"),  # amax: through padded_lengths, which wraps it (lengths.py)
    wrapper=reduce_all,
    when="dynamo",
))

register(Patch(
    name="builtin_max_min",
    description="Python's max(t)/min(t) over a 1-D tensor exports under dynamo (its non-strict capture calls "
                "torch.maximum/minimum with the one tensor, which take two)",
    targets=("torch:minimum",),  # maximum: through padded_lengths, which wraps it (lengths.py)
    wrapper=single_tensor_extreme,
    when="dynamo",
))

register(Patch(
    name="floor_divide_ints",
    description="integer floor division (//, torch.floor_divide) of data tensors floors under TorchScript, as PyTorch does: the "
                "exporter's Div truncates negative quotients (a length formula on a short sequence)",
    targets=("torch:floor_divide", "torch:Tensor.floor_divide", "torch:Tensor.__floordiv__"),
    wrapper=_floor_divide,
    when="torchscript",
))

register(Patch(
    name="rfloor_divide_ints",
    description="number // integer tensor floors under TorchScript and exports under dynamo (whose translation "
                "of floor_divide takes no number first)",
    targets=("torch:Tensor.__rfloordiv__",),
    wrapper=_rfloor_divide,
    when="export",
))

