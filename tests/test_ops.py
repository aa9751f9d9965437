"""The op tail: each case under both exporters, ONNX Runtime
against the unpatched eager model at new batch and length sizes (B=1 too), and each vanilla failure
asserted where it happens, so a patched test cannot pass by accident."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

import onnx_compat
from onnx_compat import versions

from onnx_compat.patches.registry import steps_aside

from helpers import EXPORTERS, export, run, vanilla_failure

D = 8


class Pointwise(nn.Module):
    """One op on [B, T, D]; ``op`` is looked up at call time, as user code does."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        if self.op == "expm1":
            return torch.expm1(x) + (0.001 * x).expm1() * 1000.0  # small arguments too
        if self.op == "unfold":
            return x.unfold(1, 5, 2).sum(-1) + x.transpose(1, 2).unfold(2, 4, 3).mean(-1).transpose(1, 2)[:, :1]
        if self.op == "cumsum_bool":
            return (x > 0).cumsum(1).to(x.dtype) * x + torch.cumsum(x < -1, dim=2)
        if self.op == "diff":  # position ids from masks, as transformers' masking utilities compute them
            return torch.diff(x, dim=1, prepend=x[:, :1]) + x.diff(n=2, dim=2, append=x[:, :, :2])
        if self.op == "adaptive_avg":
            return F.adaptive_avg_pool1d(x.transpose(1, 2), 5).transpose(1, 2)
        if self.op == "adaptive_max":
            return F.adaptive_max_pool1d(x.transpose(1, 2), 7).transpose(1, 2)
        raise ValueError(self.op)


class Norms(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "rms_norm":
            self.norm = nn.RMSNorm(D)
            nn.init.normal_(self.norm.weight)
        elif kind == "instance_norm":
            self.norm = nn.InstanceNorm1d(D, affine=True, track_running_stats=True)
            self.norm.running_mean.normal_()
            self.norm.running_var.uniform_(0.5, 2.0)
        else:
            self.norm = nn.utils.parametrizations.spectral_norm(nn.Conv1d(D, D, 3, padding=1))

    def forward(self, x):
        if self.kind == "rms_norm":
            return self.norm(x) + F.rms_norm(x, (D,), eps=1e-3)
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class Pool2d(nn.Module):
    """Pyramid pooling heads over an image-like [B, 3, T, D] view."""

    def __init__(self, kind):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d((4, None)) if kind == "avg" else nn.AdaptiveMaxPool2d((6, 3))

    def forward(self, x):
        return self.pool(torch.stack([x, x.sin(), x.cos()], 1)).flatten(1)


class Antialias(nn.Module):
    def __init__(self, mode, **kwargs):
        super().__init__()
        self.mode, self.kwargs = mode, kwargs

    def forward(self, x):
        return F.interpolate(x, mode=self.mode, antialias=True, **self.kwargs)


class LengthRegulator(nn.Module):
    """FastSpeech-style: each frame repeated by its duration, utterances padded to the longest."""

    def forward(self, x, durations):
        return pad_sequence([torch.repeat_interleave(h, d, dim=0) for h, d in zip(x, durations)], batch_first=True)


CASES = {
    "expm1": lambda: Pointwise("expm1"),
    "unfold": lambda: Pointwise("unfold"),
    "cumsum_bool": lambda: Pointwise("cumsum_bool"),
    "diff": lambda: Pointwise("diff"),
    "rms_norm": lambda: Norms("rms_norm"),
    "instance_norm": lambda: Norms("instance_norm"),
    "spectral_norm": lambda: Norms("spectral_norm"),
    "adaptive_avg_pool1d": lambda: Pointwise("adaptive_avg"),
    "adaptive_max_pool1d": lambda: Pointwise("adaptive_max"),
    "adaptive_avg_pool2d": lambda: Pool2d("avg"),
    "adaptive_max_pool2d": lambda: Pool2d("max"),
    "antialias_scale": lambda: Antialias("bilinear", scale_factor=(0.5, 0.3)),
    "antialias_bicubic_size": lambda: Antialias("bicubic", size=(9, 7)),
    "length_regulator": LengthRegulator,
}
IMAGES = {"antialias_scale", "antialias_bicubic_size"}
# How the unpatched export goes wrong on torch 2.13; absent: it works (the patch steps aside or is not needed).
VANILLA = {
    ("expm1", "torchscript"): "aten::expm1",
    ("expm1", "dynamo"): "mismatch",  # exp(x) - 1: small arguments lose their digits
    ("unfold", "torchscript"): "input size not accessible",
    ("cumsum_bool", "torchscript"): "tensor(bool)",
    ("diff", "torchscript"): "aten::diff",
    ("rms_norm", "torchscript"): "aten::rms_norm",
    ("instance_norm", "torchscript"): "instance_norm training for unknown batch size",
    ("spectral_norm", "torchscript"): "aten::vdot",
    ("adaptive_avg_pool1d", "torchscript"): "input size not accessible",
    ("adaptive_avg_pool1d", "dynamo"): "indices element out of data bounds",
    ("adaptive_max_pool1d", "torchscript"): "input size not accessible",
    ("adaptive_max_pool1d", "dynamo"): "Failed to convert",
    ("adaptive_avg_pool2d", "torchscript"): "output_size is not constant",
    ("adaptive_avg_pool2d", "dynamo"): "mismatch",
    ("adaptive_max_pool2d", "torchscript"): "input size not accessible",
    ("adaptive_max_pool2d", "dynamo"): "Failed to convert",
    ("antialias_scale", "torchscript"): "_upsample_bilinear2d_aa",
    ("antialias_scale", "dynamo"): "mismatch",
    ("antialias_bicubic_size", "torchscript"): "_upsample_bicubic2d_aa",
    ("length_regulator", "torchscript"): "aten::pad_sequence",
    ("length_regulator", "dynamo"): "Failed to decompose",
}


def _inputs(name, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    if name in IMAGES:
        return (torch.rand(B, 3, T, T // 2 + 3, generator=g),)
    x = torch.randn(B, T, D, generator=g)
    if name == "length_regulator":
        durations = torch.randint(0, 4, (B, T), generator=g)
        durations[0, :2] = 0  # zeros at the start, as silence gets
        return x, durations
    return (x,)


def _dynamic(name):
    if name in IMAGES:
        return {0: {0: "batch", 2: "height", 3: "width"}}
    if name == "length_regulator":  # the Python loop over the batch fixes B (docs/models.md, Limits)
        return {0: {1: "time"}, 1: {1: "time"}}
    return {0: {0: "batch", 1: "time"}}


def _sizes(name):
    if name == "length_regulator":
        return [(2, 23), (2, 50), (2, 5)]
    return [(1, 23), (3, 50), (2, 9)]


def _build(name):
    if name == "rms_norm" and not hasattr(nn, "RMSNorm"):
        pytest.skip(f"torch {torch.__version__} has no nn.RMSNorm")
    torch.manual_seed(sum(map(ord, name)))
    return CASES[name]().eval()


def _fails_here(name, exporter):
    """Whether this torch has the recorded vanilla failure (older releases may not call the op at all)."""
    if name == "spectral_norm":  # sigma through torch.vdot since torch 2.1
        import inspect
        from torch.nn.utils import parametrizations
        return "vdot" in inspect.getsource(parametrizations)
    if name == "length_regulator":  # torch.onnx's dynamo exporter does it right from 2.14 on
        return not steps_aside("pad_sequence", exporter)
    return True


def _export(model, name, exporter):
    with torch.no_grad():
        return export(model, _inputs(name, 2, 37, 0), exporter, _dynamic(name))


def _check(proto, model, name):
    for seed, (B, T) in enumerate(_sizes(name), start=1):
        args = _inputs(name, B, T, seed)
        with torch.no_grad():
            expected = model(*args).numpy()
        got = run(proto, *[a.numpy() for a in args])[0]
        assert got.shape == expected.shape, (got.shape, expected.shape)
        assert np.std(expected) > 1e-3, "degenerate reference output"
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_patched_export_matches_eager(name, exporter):
    model = _build(name)
    with onnx_compat.patched():
        proto = _export(model, name, exporter)
    _check(proto, model, name)


@pytest.mark.parametrize("name,exporter", sorted(VANILLA))
def test_vanilla_export_fails_as_recorded(name, exporter):
    if exporter not in EXPORTERS:
        pytest.skip(versions.NO_DYNAMO)
    model = _build(name)
    if not _fails_here(name, exporter):
        pytest.skip(f"torch {torch.__version__} exports {name} without the patch")
    vanilla_failure(lambda: _check(_export(model, name, exporter), model, name), VANILLA[name, exporter])


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("call,error", [
    (lambda x: F.adaptive_avg_pool1d(x, (2, 3)), "adaptive_avg_pool1d"),
    (lambda x: F.adaptive_max_pool2d(x[None], (3, -1)), "negative dimension"),
    (lambda x: x.unfold(2, 3, 0), "step is 0"),
    (lambda x: F.interpolate(x[None], scale_factor=0.5, mode="nearest-exact", antialias=True), "anti-alias"),
    (lambda x: pad_sequence([x[0], x[1, :, :3]]), "size"),
], ids=["pool_2_sizes_for_1d", "pool_to_negative", "unfold_step_0", "antialias_nearest", "pad_unequal_features"])
def test_what_the_patches_cannot_express_raises_pytorchs_error(call, error, exporter):
    """Bad arguments reach PyTorch unchanged: eager and the export fail with PyTorch's error."""
    if "pad_sequence" in repr(call.__code__.co_names) and exporter == "dynamo":
        pytest.skip("torch.onnx retries in strict mode, whose pad_sequence kernel does not check trailing sizes; "
                    "the pipeline's verification catches such a graph")
    class Bad(nn.Module):
        def forward(self, x):
            return call(x)

    x = torch.randn(2, 4, 10)
    with pytest.raises(Exception, match=f"(?i){error}"):
        call(x)
    with onnx_compat.patched(), pytest.raises(Exception) as exported:
        export(Bad(), (x,), exporter, {0: {2: "time"}})
    assert error.lower() in (str(exported.value) + repr(exported.value.__cause__)).lower(), str(exported.value)[:300]


@pytest.mark.parametrize("name", list(CASES))
def test_eager_is_untouched_inside_patched(name):
    """Outside an export the wrappers call straight through: bit-identical outputs."""
    model = _build(name)
    args = _inputs(name, 3, 20, 5)
    with torch.no_grad():
        expected, again = model(*args), model(*args)
        with onnx_compat.patched():
            got = model(*args)
    if torch.equal(again, expected):
        assert torch.equal(got, expected)
    else:  # this torch's kernel is not bit-reproducible itself (InstanceNorm on torch 2.0)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
