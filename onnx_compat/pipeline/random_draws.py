"""Models whose outputs are random: refused before any export, naming where they draw.

A GAN vocoder that makes its own noise (coqui-tts' UnivNet: ``x = torch.randn([B, C, T])`` in its
forward) or a watermark generator that draws a random message when none is given (audioseal) returns
different numbers at each call on the same input. Both exporters write such a model "right" (dynamo a
``RandomNormal``, TorchScript the draw too or a constant), but no graph can match an eager run that draws
again: measured on the sweep (round two), the exports "verified wrong" by 0.049 (UnivNet, B=1 T=23) and
0.41 (AudioSeal), which read like an exporter bug and sent the culprit search to the first module the
noise reaches (UnivNet's ``first_conv``). So ``check_outputs`` notices a draw (the CPU generator's state
moved during the model's run), runs the model again, and when the outputs differ, refuses the model
naming the calls that drew: the noise belongs in an input (or the model should be exported with
``verify=False``, unproven).
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Callable, List, Sequence

import torch
from torch.overrides import TorchFunctionMode

from onnx_compat.errors import RandomOutputs
from onnx_compat.runtimes.compare import closeness

# torch functions and Tensor methods that draw from a generator (dropout draws only in training, which an
# export never runs in, so it is not named)
_DRAWS = frozenset(("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal",
                    "bernoulli", "multinomial", "poisson", "normal_", "uniform_", "bernoulli_", "random_",
                    "exponential_", "geometric_", "log_normal_", "cauchy_"))
_SKIPPED = (os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def generator_state() -> torch.Tensor:
    return torch.random.get_rng_state()


def check_repeatable(run: Callable[[], Sequence[torch.Tensor]], first: Sequence[torch.Tensor],
                     names: Sequence[str]) -> None:
    """``run`` again gives ``first`` again, or the model draws random numbers: ``RandomOutputs``."""
    second = run()
    differ = [name for name, a, b in zip(names, first, second) if not _same(a, b)]
    if not differ:
        return
    with _Draws() as draws:
        run()
    where = "; ".join(draws.sites) or "a call onnx_compat could not locate"
    raise RandomOutputs(
        f"the model's outputs {differ} change from one call to the next on the same inputs: it draws random "
        f"numbers ({where}), which an exported graph cannot reproduce, so it cannot be verified against eager. "
        f"Give the noise (or message) as an input, or export with verify=False (unproven)", sites=draws.sites)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two eager runs agree by the runtime layer's one rule (exact for integers, NaN where NaN), at a
    tolerance far below any export's: a model that draws numbers differs by whole values."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    return closeness(a.detach(), b.detach(), atol=1e-6, rtol=1e-5).ok


class _Draws(TorchFunctionMode):
    """Records where the model calls a drawing function: the first frame outside torch and onnx_compat."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: List[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _DRAWS:
            site = _caller(func.__name__)
            if site and site not in self.sites:
                self.sites.append(site)
        return func(*args, **(kwargs or {}))


def _caller(name: str) -> str:
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}" + (f" `{line}`" if line else "")
