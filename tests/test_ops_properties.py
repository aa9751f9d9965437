"""Property tests of the op-tail formulas: eagerly against PyTorch over random sizes (cheap), and
through one export per exporter at random runtime sizes and values (ONNX Runtime against eager)."""
import functools
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st
from torch.nn.utils.rnn import pad_sequence

import onnx_compat
from onnx_compat.patches.arithmetic import expm1
from onnx_compat.patches.pooling import adaptive_pool
from onnx_compat.patches.resize import antialias_resize
from onnx_compat.patches.sequences import pad_sequence as padded_to_longest
from onnx_compat.patches.windows import unfold

from helpers import EXPORTERS, export, run
from onnx_compat.models.op_tail_cases import LengthRegulator

_POOL = {("avg", 1): F.adaptive_avg_pool1d, ("avg", 2): F.adaptive_avg_pool2d, ("avg", 3): F.adaptive_avg_pool3d,
         ("max", 1): F.adaptive_max_pool1d, ("max", 2): F.adaptive_max_pool2d, ("max", 3): F.adaptive_max_pool3d}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["avg", "max"]), n=st.integers(1, 3), data=st.data())
def test_adaptive_bins_match_eager(kind, n, data):
    """Any input size, any output size (smaller, equal, larger, None), 1-3 pooled dims."""
    sizes = [data.draw(st.integers(1, 40 if n == 1 else 12)) for _ in range(n)]
    out = tuple(data.draw(st.one_of(st.none(), st.integers(1, 45 if n == 1 else 14))) for _ in range(n))
    x = torch.randn(2, 3, *sizes)
    expected = _POOL[kind, n](x, out if n > 1 else out[0] or sizes[0])
    got = adaptive_pool(x, out if n > 1 else (out[0] or sizes[0],), kind)
    torch.testing.assert_close(got, expected)


@settings(max_examples=60, deadline=None)
@given(height=st.integers(2, 40), width=st.integers(2, 40), mode=st.sampled_from(["bilinear", "bicubic"]),
       data=st.data())
def test_antialias_weights_match_eager(height, width, mode, data):
    if data.draw(st.booleans()):
        kwargs = {"size": (data.draw(st.integers(1, 50)), data.draw(st.integers(1, 50)))}
    else:
        kwargs = {"scale_factor": (data.draw(st.floats(0.1, 3.0)), data.draw(st.floats(0.1, 3.0))),
                  "recompute_scale_factor": data.draw(st.booleans())}
        if min(int(height * kwargs["scale_factor"][0]), int(width * kwargs["scale_factor"][1])) < 1:
            return  # PyTorch refuses an empty output
    x = torch.rand(1, 2, height, width)
    expected = F.interpolate(x, mode=mode, antialias=True, **kwargs)
    if expected.shape[3] == 1 and expected.shape[2] != height:
        return  # eager's kernel repeats one row there (torch 2.13); docs/models.md, Limits, shows it
    got = antialias_resize(x, kwargs.get("size"), kwargs.get("scale_factor"), mode,
                           kwargs.get("recompute_scale_factor", False))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 30), size=st.integers(0, 8), step=st.integers(1, 5), dim=st.integers(-2, 1))
def test_unfold_gather_matches_eager(length, size, step, dim):
    if size > length:
        return  # PyTorch's own error
    x = torch.randn(3, length) if dim in (-1, 1) else torch.randn(length, 3)
    torch.testing.assert_close(unfold(x, dim, size, step), x.unfold(dim, size, step))


def test_expm1_keeps_small_arguments_exact():
    x = torch.cat([torch.logspace(-12, 1, 300), -torch.logspace(-12, 1, 300), torch.zeros(1)])
    torch.testing.assert_close(expm1(x), torch.expm1(x), atol=0, rtol=5e-7)
    assert ((torch.exp(x) - 1 - torch.expm1(x)).abs() / torch.expm1(x).abs().clamp(min=1e-30)).max() > 1e-2


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), batch_first=st.booleans(),
       left=st.booleans())
def test_pad_to_longest_matches_eager(lengths, batch_first, left):
    if max(lengths) == 0:
        return
    seqs = [torch.randn(n, 3) for n in lengths]
    side = "left" if left else "right"
    if "padding_side" not in inspect.signature(pad_sequence).parameters:  # torch < 2.6: right padding only
        assume(not left)
        expected = pad_sequence(seqs, batch_first=batch_first, padding_value=-1.0)
    else:
        expected = pad_sequence(seqs, batch_first=batch_first, padding_value=-1.0, padding_side=side)
    torch.testing.assert_close(padded_to_longest(seqs, batch_first, -1.0, side), expected)


@functools.lru_cache(maxsize=None)
def _exported(what, exporter):
    if what == "regulator":
        model = LengthRegulator().eval()
        args = (torch.randn(3, 11, 4), torch.randint(0, 4, (3, 11)))
        dynamic = {0: {1: "time"}, 1: {1: "time"}}
    else:
        model = torch.nn.AdaptiveAvgPool1d(5) if what == "avg" else torch.nn.AdaptiveMaxPool1d(6)
        args = (torch.randn(2, 4, 37),)
        dynamic = {0: {0: "batch", 2: "time"}}
    with onnx_compat.patched():
        return model, export(model, args, exporter, dynamic)


@pytest.mark.parametrize("exporter", EXPORTERS)
@settings(max_examples=15, deadline=None)
@given(time=st.integers(1, 40), seed=st.integers(0, 2 ** 16), zero_rows=st.integers(0, 2))
def test_length_regulator_at_random_durations(exporter, time, seed, zero_rows):
    """Random durations, zeros included (whole utterances of zeros too, unless all are)."""
    model, proto = _exported("regulator", exporter)
    g = torch.Generator().manual_seed(seed)
    x, durations = torch.randn(3, time, 4, generator=g), torch.randint(0, 5, (3, time), generator=g)
    durations[:zero_rows] = 0
    if durations.sum() == 0:
        durations[-1, -1] = 1
    expected = model(x, durations).numpy()
    got = run(proto, x.numpy(), durations.numpy())[0]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize("exporter", EXPORTERS)
@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 4), time=st.integers(1, 90), seed=st.integers(0, 2 ** 16))
def test_adaptive_pooling_at_random_lengths(kind, exporter, batch, time, seed):
    """Lengths shorter than the bins, equal, not dividing, much longer: all right in ONNX Runtime."""
    model, proto = _exported(kind, exporter)
    x = torch.randn(batch, 4, time, generator=torch.Generator().manual_seed(seed))
    np.testing.assert_allclose(run(proto, x.numpy())[0], model(x).numpy(), atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 12), n=st.integers(0, 4), dim=st.integers(-2, 1), extra=st.integers(0, 3),
       boolean=st.booleans())
def test_diff_slices_match_eager(length, n, dim, extra, boolean):
    from onnx_compat.patches.arithmetic import diff
    x = torch.randn(3, length) if dim in (-1, 1) else torch.randn(length, 3)
    if boolean:
        x = x > 0
    shape = list(x.shape)
    shape[dim] = extra
    prepend = torch.zeros(shape, dtype=x.dtype) if extra else None
    if n > length + extra:
        return
    torch.testing.assert_close(diff(x, n, dim, prepend=prepend), torch.diff(x, n, dim, prepend=prepend))
