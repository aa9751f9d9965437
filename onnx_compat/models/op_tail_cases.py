"""The op-tail cases: one small model per op the single-op patches handle, each a ``PatchCase`` row with
how the unpatched export goes wrong. One table for both sides: ``tests/test_ops.py`` asserts each row
(patched export against the unpatched eager model, the vanilla failure where it happens), and
``benchmarks/op_tail.py`` / ``rewrite_latency.py`` measure the same graphs; neither imports the other."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from onnx_compat.patches.registry import steps_aside
from onnx_compat.testing import PatchCase

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
        if self.op == "logcumsumexp":  # minGRU's log-space scan: a prefix far below the running maximum
            log_a = torch.cumsum(-F.softplus(x), dim=1)
            return torch.exp(log_a + torch.logcumsumexp(x - log_a, dim=1)) + x.logcumsumexp(2)
        if self.op == "eps_guard":  # an envelope's guard, x / (y + 1e-8), where y is exactly 0 (an iSTFT's edges)
            y = F.relu(x)
            return x / (y + 1e-8) * (y > 0) + y / (y + 1e-8)
        if self.op == "peak":  # a peak normalisation: the largest magnitude of the whole tensor, no dim
            return x / x.abs().amax() + torch.amin(x, keepdim=True)
        if self.op == "builtin_max":  # Python's max/min over a 1-D tensor (torch-struct: assert max(lengths) <= N)
            energy = x.abs().mean((0, 2))
            return x / max(energy) + min(energy)
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


def _sequence(B, T, seed):
    return (torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed)),)


def _image(B, T, seed):
    return (torch.rand(B, 3, T, T // 2 + 3, generator=torch.Generator().manual_seed(seed)),)


def _durations(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g)
    durations = torch.randint(0, 4, (B, T), generator=g)
    durations[0, :2] = 0  # zeros at the start, as silence gets
    return x, durations


def _vdot_in_spectral_norm(exporter):
    """sigma through torch.vdot since torch 2.1: older releases do not call the op at all."""
    import inspect
    from torch.nn.utils import parametrizations
    return "vdot" in inspect.getsource(parametrizations)


class FloorDivision(nn.Module):
    """Length arithmetic on integer tensors that goes negative (a sequence shorter than a receptive field):
    ``//`` and ``torch.floor_divide`` floor in PyTorch, also for the reflected ``number // tensor``."""

    def forward(self, x):
        counts = (x > 0).sum(1)  # int64 [B, D], 0..T: about T/2, so below the shifts some of the time
        half = x.shape[1] // 2
        steps = (counts - half) // 3 + torch.floor_divide(counts - 5, 4) + 7 // (counts - half - 100)
        return steps.to(x.dtype) * x.mean(1)


class SizeNumbers(nn.Module):
    """Index arithmetic with a size as the number, as position and bucket code writes it: reformer-pytorch's
    buckets wrap positions around the length (``% seqlen``); hashing and interleaving code takes bitwise ops and
    shifts of positions by a size; a decay raised to a size-dependent power; a clamp at the length made with
    ``torch.tensor(T)``; a mask times a count of sizes."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        T = x.shape[1]
        p = torch.arange(T, device=x.device)
        if self.op == "remainder":  # remainder.Scalar and remainder.Scalar_Tensor
            rotated = x[:, (p + T // 2) % T]
            return rotated + (T % (p + 1)).to(x.dtype)[None, :, None] * x
        if self.op == "bitwise":  # bitwise ops, shifts and pow with a size as the number
            mixed = ((p ^ T) & (T + 3)) + (p | T) + ((p << (T % 3)) >> (T % 2)) + (T & (p + 1))
            decay = (p.to(x.dtype) / T) ** (T % 4 + 1)
            return x * decay[None, :, None] + mixed.to(x.dtype)[None, :, None] / T
        if self.op == "tensor_of_size":  # torch.tensor of a size
            return torch.minimum(torch.cumsum(x.abs(), 1), torch.tensor(T).to(x.dtype) / 4) * x.sign()
        if self.op == "mask_times":  # a mask times a number from sizes (mul.Scalar of a bool tensor)
            return x * ((x > 0) * (T % 3 + 1)).to(x.dtype)
        raise ValueError(self.op)


class SplitBySize(nn.Module):
    """Two halves cut by a size, ``x.split(x.shape[1] // 2, dim=1)`` (an even length): the split size is a value
    of the graph, not a constant (under dynamo, ``SplitToSequence`` of a 0-d size)."""

    def forward(self, x):
        first, second = x.split(x.shape[1] // 2, dim=1)
        return torch.cat([second.flip(1) * 2, first.cumsum(1)], dim=-1)


class MovedAxes(nn.Module):
    """Features cut into 2 x 4 and axes moved by negative numbers, as transformers' Gemma 3n audio encoder moves
    its unfolded frame axis (``torch.movedim(x_unfolded, source=-1, destination=2)``), then permuted."""

    def forward(self, x):  # [B, T, 8]
        y = x.reshape(x.shape[0], x.shape[1], 2, 4)
        z = torch.movedim(y, -1, 1)  # [B, 4, T, 2]
        w = y.moveaxis((-1, -2), (0, 1))  # [4, 2, B, T]
        return z.permute(0, 2, 3, 1).flatten(2) * 2 + w.permute(2, 3, 1, 0).flatten(2).cumsum(1)


def _no_rms_norm(exporter):
    return None if hasattr(nn, "RMSNorm") else f"torch {torch.__version__} has no nn.RMSNorm"


def _case(name, build, vanilla, inputs=_sequence, dynamic={0: {0: "batch", 1: "time"}}, **options):
    return PatchCase(name, build, inputs, dynamic, vanilla=vanilla, **options)


def _image_case(name, build, vanilla):
    return _case(name, build, vanilla, _image, {0: {0: "batch", 2: "height", 3: "width"}})


# How the unpatched export goes wrong on torch 2.13; absent: it works (the patch steps aside or is not needed).
CASES = [
    _case("expm1", lambda: Pointwise("expm1"),
          {"torchscript": "aten::expm1", "dynamo": "mismatch"}),  # exp(x) - 1: small arguments lose their digits
    _case("unfold", lambda: Pointwise("unfold"), {"torchscript": "input size not accessible"}),
    _case("cumsum_bool", lambda: Pointwise("cumsum_bool"), {"torchscript": "tensor(bool)"}),
    _case("diff", lambda: Pointwise("diff"), {"torchscript": "aten::diff"}),
    _case("logcumsumexp", lambda: Pointwise("logcumsumexp"), {"torchscript": "aten::logcumsumexp"},
          exporters=("torchscript",)),  # dynamo writes it
    _case("eps_guard", lambda: Pointwise("eps_guard"), {"dynamo": "nan"}, exporters=("dynamo",)),  # TS: no rewriter
    _case("amax_amin_all", lambda: Pointwise("peak"), {"dynamo": "Required parameter 'dim' is not provided"}),
    # dynamo's non-strict capture hands max(t) to torch.maximum(t) wherever it is called; the model's own calls
    # are redirected before either exporter traces (int_calls; pattern_models_round3.BuiltinReduction), which
    # onnx_compat's own code, as this model is, never is
    _case("builtin_max_min", lambda: Pointwise("builtin_max"), {"dynamo": "missing 1 required positional"},
          exporters=("dynamo",)),
    # TorchScript's Div truncates negative quotients; dynamo's floor_divide translation takes no number first
    _case("floor_divide", FloorDivision, {"torchscript": "mismatch", "dynamo": "aten_floor_divide"}),
    _case("rms_norm", lambda: Norms("rms_norm"), {"torchscript": "aten::rms_norm"}, skip=_no_rms_norm),
    _case("instance_norm", lambda: Norms("instance_norm"),
          {"torchscript": "instance_norm training for unknown batch size"}),
    _case("spectral_norm", lambda: Norms("spectral_norm"), {"torchscript": "aten::vdot"},
          fails_here=_vdot_in_spectral_norm),
    _case("adaptive_avg_pool1d", lambda: Pointwise("adaptive_avg"),
          {"torchscript": "input size not accessible", "dynamo": "indices element out of data bounds"}),
    _case("adaptive_max_pool1d", lambda: Pointwise("adaptive_max"),
          {"torchscript": "input size not accessible", "dynamo": "Failed to convert"}),
    _case("adaptive_avg_pool2d", lambda: Pool2d("avg"),
          {"torchscript": "output_size is not constant", "dynamo": "mismatch"}),
    _case("adaptive_max_pool2d", lambda: Pool2d("max"),
          {"torchscript": "input size not accessible", "dynamo": "Failed to convert"}),
    _image_case("antialias_scale", lambda: Antialias("bilinear", scale_factor=(0.5, 0.3)),
                {"torchscript": "_upsample_bilinear2d_aa", "dynamo": "mismatch"}),
    _image_case("antialias_bicubic_size", lambda: Antialias("bicubic", size=(9, 7)),
                {"torchscript": "_upsample_bicubic2d_aa"}),
    # a size as the number of remainder, pow, bitwise ops and shifts (reformer's buckets: % seqlen): torchlib's
    # Scalar translations make the number a constant (TorchScript exports % of a size; it writes no integer Xor)
    _case("size_remainder", lambda: SizeNumbers("remainder"), {"dynamo": "aten_remainder_scalar"}),
    _case("size_bitwise_pow", lambda: SizeNumbers("bitwise"), {"dynamo": "aten_bitwise_xor_scalar"},
          exporters=("dynamo",)),
    # a bool tensor times a size: torch.export writes mul.Scalar there alone (a float or integer tensor: mul.Tensor)
    _case("mask_times_size", lambda: SizeNumbers("mask_times"), {"dynamo": "aten_mul_scalar"}),
    # TorchScript's movedim writes a negative source into the Transpose's perm (dynamo counts it from the front)
    _case("movedim_negative", MovedAxes, {"torchscript": "Invalid attribute perm"}),
    # unpatched it exports; wrapped by constant_values, torch.tensor lost the non-strict exporter's tracing of a size
    _case("tensor_of_size", lambda: SizeNumbers("tensor_of_size"), {}),
    # the Python loop over the batch fixes B (docs/models.md, Limits): lengths vary, B does not
    _case("length_regulator", LengthRegulator, {"torchscript": "aten::pad_sequence", "dynamo": "Failed to decompose"},
          _durations, {0: {1: "time"}, 1: {1: "time"}}, sizes=((2, 23), (2, 50), (2, 5)),
          # torch.onnx's dynamo exporter does it right from 2.14 on
          fails_here=lambda exporter: not steps_aside("pad_sequence", exporter)),
]
