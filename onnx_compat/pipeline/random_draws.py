"""Models whose outputs are random: each draw recorded in eager, or the model refused naming where it draws.

A GAN vocoder that makes its own noise (coqui-tts' UnivNet: ``x = torch.randn([B, C, T])`` in its
forward) or a watermark generator that draws a random message when none is given (audioseal) returns
different numbers at each call on the same input. Both exporters write such a model "right" (dynamo a
``RandomNormal``, TorchScript the draw too or a constant), but no graph can match an eager run that draws
again: measured on the sweep (round two), the exports "verified wrong" by 0.049 (UnivNet, B=1 T=23) and
0.41 (AudioSeal), which read like an exporter bug and sent the culprit search to the first module the
noise reaches (UnivNet's ``first_conv``). So ``check_outputs`` notices a draw (the CPU generator's state
moved during the model's run) and runs the model again. When the outputs differ and every draw is one an
ONNX random node makes (normal or uniform numbers: ``randn``, ``rand``, their ``_like`` forms, ``normal_``,
``uniform_``, ``normal`` of two numbers; ``randint``, which both exporters write as uniform numbers rounded
down), the export goes on: verification records each draw of the eager reference run (``Recorder``, in
call order) and feeds them to the graph's random nodes (``draw_inputs.py``), so the numbers are compared
as for any model. A draw no ONNX node makes the same way (``randperm``,
``multinomial``, ``bernoulli``, ``poisson``, ...) keeps the refusal naming its line: the noise belongs in an
input there (or the model is exported with ``verify=False``, unproven).
"""
from __future__ import annotations

import linecache
import numbers
from dataclasses import dataclass
from typing import Callable, ContextManager, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode

from onnx_compat.errors import RandomOutputs
from onnx_compat.patches._warning_site import model_frame_outside_torch
from onnx_compat.runtimes.compare import closeness

# torch functions and Tensor methods that draw from a generator (dropout draws only in training, which an
# export never runs in, so it is not named)
_DRAWS = frozenset(("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal",
                    "bernoulli", "multinomial", "poisson", "normal_", "uniform_", "bernoulli_", "random_",
                    "exponential_", "geometric_", "log_normal_", "cauchy_"))


def generator_state() -> torch.Tensor:
    return torch.random.get_rng_state()


def check_repeatable(run: Callable[[], Sequence[torch.Tensor]], first: Sequence[torch.Tensor],
                     names: Sequence[str]) -> List[str]:
    """``run`` again gives ``first`` again (``[]``), or the model draws random numbers: the sites of its draws
    when ONNX random nodes can make each of them (verification then feeds eager's draws to the graph), else
    ``RandomOutputs`` naming the draws no ONNX node makes."""
    second = run()
    differ = [name for name, a, b in zip(names, first, second) if not _same(a, b)]
    if not differ:
        return []
    with Recorder() as recorder:
        run()
    draws = recorder.draws
    unmatched = [d.site for d in draws if not d.kind]
    if draws and not unmatched:
        return sites_of(draws)
    where = "; ".join(dict.fromkeys(unmatched)) or "a call onnx_compat could not locate"
    raise RandomOutputs(
        f"the model's outputs {differ} change from one call to the next on the same inputs: it draws random "
        f"numbers ({where}) that no ONNX random node draws (only normal and uniform numbers are: randn, rand, "
        f"randn_like, rand_like, normal_, uniform_, normal of two numbers, randint), so the graph cannot be fed "
        f"eager's draws and cannot be verified. Give the noise (or message) as an input, or export with "
        f"verify=False (unproven)", sites=sites_of(draws))


def drawing_note(sites: Sequence[str]) -> str:
    """The report's finding for a model that draws: what its verification did instead of refusing."""
    return (f"the model draws random numbers ({'; '.join(sites)}): the graph keeps its random nodes, and "
            f"verification fed each of them the eager reference run's own draw (recorded in call order)")


def sites_of(draws: Sequence["Draw"]) -> List[str]:
    return list(dict.fromkeys(d.site for d in draws))


def run_recording(run: Callable[[], Sequence[torch.Tensor]], fresh: Callable[[], ContextManager],
                  drawing: bool = False) -> Tuple[Sequence[torch.Tensor], List["Draw"]]:
    """``run``'s outputs and the draws it made. ``drawing`` (the model is known to draw): run once under the
    ``Recorder``, inside ``fresh()`` (the model as it was: a model that keeps its draw, AudioSeal's
    ``self.message``, draws again at each run, as its graph does). Otherwise run plainly, and only when the
    generator moved again, under the ``Recorder`` (whose outputs are then the ones returned), so a model
    that does not draw pays nothing."""
    if not drawing:
        state = generator_state()
        outputs = run()
        if torch.equal(state, generator_state()):
            return outputs, []
    with fresh(), Recorder() as recorder:
        outputs = run()
    return outputs, recorder.draws


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two eager runs agree by the runtime layer's one rule (exact for integers, NaN where NaN), at a
    tolerance far below any export's: a model that draws numbers differs by whole values."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    return closeness(a.detach(), b.detach(), atol=1e-6, rtol=1e-5).ok


@dataclass
class Draw:
    """One draw of an eager run. ``kind``: "normal" (``a`` the mean, ``b`` the standard deviation) or "uniform"
    (``a``, ``b`` the bounds), as ONNX random nodes draw; "" when none does (randperm, bernoulli, ...).
    ``value``: the numbers drawn (None for the unmatched kinds); ``site``: the call and its line;
    ``integer``: ``randint``'s whole numbers, a uniform draw the graph must round down (its dtype may be
    float: ``randint_like`` of a float tensor)."""

    kind: str
    a: float
    b: float
    value: Optional[torch.Tensor]
    site: str
    integer: bool = False


class Recorder(TorchFunctionMode):
    """Records each call of a drawing function, in call order, with the numbers it drew. The call runs as it
    would without the recorder: the model's outputs are the plain eager ones."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: List[Draw] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        if name in _DRAWS:
            site = _caller(name) or f"{name} at a call onnx_compat could not locate"
            kind, a, b = _distribution(name, args, kwargs)
            value = out.detach().clone() if kind and isinstance(out, torch.Tensor) else None
            self.draws.append(Draw(kind if value is not None else "", a, b, value, site, name.startswith("randint")))
        return out


class Replayer(TorchFunctionMode):
    """Each drawing call returns the next of ``values`` instead of drawing (an in-place draw is filled with
    it): an eager run replayed on chosen draws. ``calls`` counts the drawing calls seen."""

    def __init__(self, values: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.values, self.calls = list(values), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in _DRAWS or self.calls >= len(self.values):
            return func(*args, **(kwargs or {}))
        value, self.calls = self.values[self.calls], self.calls + 1
        if func.__name__.endswith("_"):  # in place: the tensor drawn into
            with torch.no_grad():
                return args[0].copy_(value)
        return value.clone()


def live_draws(run: Callable[[], Sequence[torch.Tensor]], fresh: Callable[[], ContextManager], draws: Sequence[Draw],
               expected: Sequence[torch.Tensor]) -> List[bool]:
    """For each draw, whether the outputs depend on it: the run replayed on the recorded draws gives
    ``expected``; with draw k alone drawn anew (same kind, shape and parameters) the outputs change, or the
    draw is dead (``x = torch.randn(...)`` overwritten before use: the exporter drops it). A replay that
    does not reproduce ``expected`` leaves every draw live. Each run inside ``fresh()``: the model as it was."""
    values = [d.value for d in draws]

    def replayed(chosen) -> Optional[Sequence[torch.Tensor]]:
        with fresh(), Replayer(chosen) as replayer:
            got = run()
        return got if replayer.calls == len(chosen) else None
    again = replayed(values)
    if again is None or not all(_same(a, b) for a, b in zip(again, expected)):
        return [True] * len(draws)
    live = []
    for k, draw in enumerate(draws):
        other = _fresh(draw)
        got = replayed(values[:k] + [other] + values[k + 1:])
        live.append(got is None or not all(_same(a, b) for a, b in zip(got, expected)))
    return live


def _fresh(draw: Draw) -> torch.Tensor:
    """Another draw like ``draw``, not equal to it (a few bits drawn again can come out the same)."""
    for _ in range(8):
        other = _like(draw)
        if not torch.equal(other, draw.value):
            break
    return other


def _like(draw: Draw) -> torch.Tensor:
    if draw.integer:
        return torch.randint(int(draw.a), int(draw.b), draw.value.shape, dtype=draw.value.dtype)
    if draw.kind == "normal":
        return draw.a + draw.b * torch.randn_like(draw.value)
    return draw.a + (draw.b - draw.a) * torch.rand_like(draw.value)


def _distribution(name: str, args, kwargs) -> Tuple[str, float, float]:
    """What ``name`` called with ``args`` draws, as an ONNX random node would: ("normal", mean, std),
    ("uniform", low, high), or ("", 0, 0) when no ONNX node draws it (a tensor mean, randperm, ...)."""
    if name in ("randn", "randn_like"):
        return "normal", 0.0, 1.0
    if name in ("rand", "rand_like"):
        return "uniform", 0.0, 1.0
    if name == "normal_":
        mean, std = _numbers(args[1:], kwargs, ("mean", "std"), (0.0, 1.0))
        return ("normal", mean, std) if mean is not None else ("", 0.0, 0.0)
    if name == "uniform_":
        low, high = _numbers(args[1:], kwargs, ("from", "to"), (0.0, 1.0))
        return ("uniform", low, high) if low is not None else ("", 0.0, 0.0)
    if name == "normal":  # torch.normal(mean, std, size): two numbers; a tensor mean or std is not one node
        mean, std = _numbers(args, kwargs, ("mean", "std"), (None, None))
        return ("normal", mean, std) if mean is not None else ("", 0.0, 0.0)
    if name in ("randint", "randint_like"):
        bounds = _int_bounds(list(args[1:] if name == "randint_like" else args), kwargs)
        return ("uniform", float(bounds[0]), float(bounds[1])) if bounds else ("", 0.0, 0.0)
    return "", 0.0, 0.0


def _int_bounds(args, kwargs):
    """``low``, ``high`` of ``randint([low,] high, size)`` or ``randint_like(x, [low,] high)`` (the size is a
    sequence, so the numbers among the arguments are the bounds); None when they cannot be read."""
    given = [a for a in args if _number(a)]
    if "high" in kwargs:
        given = [kwargs.get("low", given[0] if given else 0), kwargs["high"]]
    elif len(given) == 1:
        given = [kwargs.get("low", 0)] + given
    return given[:2] if len(given) >= 2 and all(_number(g) for g in given[:2]) else None


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _numbers(args, kwargs, names, defaults):
    """The two parameters by position or keyword, as floats; (None, None) when either is not a number."""
    got = [args[k] if k < len(args) else kwargs.get(n, d) for k, (n, d) in enumerate(zip(names, defaults))]
    if all(_number(v) for v in got):
        return float(got[0]), float(got[1])
    return None, None


def _caller(name: str) -> str:
    frame = model_frame_outside_torch()
    if frame is None:
        return ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}" + (f" `{line}`" if line else "")
