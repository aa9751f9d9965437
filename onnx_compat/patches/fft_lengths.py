"""``next_fast_len`` of a size while exporting (scipy's, as FFT convolutions pad with it).

An FFT convolution pads both operands to at least ``N + M - 1`` so the circular product is the linear one, and
rounds that up to a length the FFT is fast at: ``scipy.fft.next_fast_len`` / ``scipy.fftpack.next_fast_len``
(Mega's damped EMA, fftconvolve-style code). scipy reads the size as a Python int: TorchScript freezes the
example's length into the graph (a TracerWarning at scipy's own line), dynamo specialises it. The frozen
length is wrong only past the example, and little at first: a Mega LM's TorchScript graph passed verification
at T = 23, 53 and 30 (3.4e-5) and was 5e-4 off at T = 60 and failed to run at 150. Any length of at least the
size gives the same linear convolution, so while exporting the size itself is the length: the padding follows
the input in the graph. Where a model used the rounded length otherwise, verification at new sizes says so.
"""
from __future__ import annotations

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches.size_math import symbolic_size, traced_size
from onnx_compat.patches.when import dynamo_exporting, torchscript_exporting


def _traced_size(value) -> bool:
    """A size the export follows: dynamo's symbolic int, or TorchScript's traced 0-d integer tensor."""
    return (dynamo_exporting() and symbolic_size(value)) or (torchscript_exporting() and traced_size(value))


def _the_size_itself(wrapped, instance, args, kwargs):
    target = args[0] if args else kwargs.get("target")
    if _traced_size(target):
        return target
    return wrapped(*args, **kwargs)


_TARGETS = ("scipy.fft:next_fast_len", "scipy.fftpack:next_fast_len")

register(Patch(
    name="fast_fft_lengths",
    description="scipy's next_fast_len of a traced size is the size itself while exporting (any FFT length of "
                "at least N + M - 1 gives the same linear convolution), so the padding follows the input",
    targets=_TARGETS,
    optional=_TARGETS,  # either module may be missing in a scipy release
    wrapper=_the_size_itself,
    when="export",
    library="scipy",
    signature=("target",),
))
