"""Small models of their own for each pattern of issue #24, used by test_patterns.py.

Kept out of the test module: pytest rewrites the ``assert`` statements of test modules, and the value
checks below must reach the exporters as model code has them.
"""
import math
import warnings
from typing import List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# --- 1. overlap-add with F.fold -------------------------------------------------------------------

class FoldISTFT(nn.Module):
    """A "same"-padded ISTFT head written by hand: irfft, window, F.fold overlap-add, the window
    envelope made the same way, checked, squeezed and divided out."""

    def __init__(self, n_fft=16, hop=4, channels=8):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.proj = nn.Conv1d(channels, n_fft + 2, 1)
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, x):  # [B, C, T] -> [B, (T - 1) * hop]
        mag, phase = self.proj(x).chunk(2, dim=1)
        spec = torch.exp(mag).clip(max=1e2) * (torch.cos(phase) + 1j * torch.sin(phase))
        frames = spec.shape[-1]
        pad = (self.n_fft - self.hop) // 2
        size = (frames - 1) * self.hop + self.n_fft
        y = torch.fft.irfft(spec, self.n_fft, dim=1, norm="backward") * self.window[None, :, None]
        y = F.fold(y, output_size=(1, size), kernel_size=(1, self.n_fft), stride=(1, self.hop))[:, 0, 0, pad:-pad]
        squares = self.window.square().expand(1, frames, -1).transpose(1, 2)
        envelope = F.fold(squares, output_size=(1, size), kernel_size=(1, self.n_fft),
                          stride=(1, self.hop)).squeeze()[pad:-pad]
        assert (envelope > 1e-11).all()
        return y / envelope


class ChunkOverlapAdd(nn.Module):
    """Dual-path style: 50 %-overlapping chunks out with F.unfold, processed, added back with nn.Fold."""

    def __init__(self, channels=4, chunk=6):
        super().__init__()
        self.chunk, self.hop = chunk, chunk // 2
        self.mix = nn.Linear(chunk, chunk)

    def forward(self, x):  # [B, C, L]
        length = x.shape[-1]
        chunks = F.unfold(x[..., None], (self.chunk, 1), padding=(self.chunk, 0), stride=(self.hop, 1))
        b, ck, n = chunks.shape
        chunks = self.mix(chunks.reshape(b, -1, self.chunk, n).transpose(2, 3)).transpose(2, 3).reshape(b, ck, n)
        fold = nn.Fold((length, 1), (self.chunk, 1), padding=(self.chunk, 0), stride=(self.hop, 1))
        return fold(chunks)[..., 0]


class Fold2d(nn.Module):
    """Blocks of an image-like map with stride, dilation and padding on both axes, folded back."""

    def forward(self, x):  # [B, 2, H, W]
        geometry = dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1))
        blocks = F.unfold(x, **geometry)
        return F.fold(blocks * blocks.tanh(), x.shape[-2:], **geometry)


# --- 2. value checks ------------------------------------------------------------------------------

class ValueChecks(nn.Module):
    def forward(self, x):
        envelope = x.abs() + 0.1
        assert (envelope > 1e-11).all()
        torch._assert((envelope > 0).all(), "envelope must be positive")
        if torch.isnan(x).any():
            raise ValueError(f"NaN in the input of shape {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise RuntimeError
        return x / envelope


class ValueBranch(nn.Module):
    def forward(self, x):
        if (x > 0).all():
            return x
        return -x


class ValueSelect(nn.Module):
    """Branches on values whose sides only pick values: two names bound on both sides (the second reading the
    side's first), and a normaliser with no else (the name keeps its value where the test is false)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = self.lin(x)
        peak = y.abs().max()
        if y.mean() > 0:
            z = y * 2
            w = z.sum(-1, keepdim=True)
        else:
            z = torch.relu(y)
            w = -z.mean(-1, keepdim=True)
        if peak > 4:
            z = z / peak
        return z + w


# --- 3. complex values made by a cast -------------------------------------------------------------

class ComplexCast(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, x):  # [B, T, 8]
        if self.form == "to":
            z = x.to(torch.complex64)
        elif self.form == "type":
            z = x.type(torch.cfloat)
        elif self.form == "to_keyword":
            z = (2 * x).to(dtype=torch.cfloat)
        else:
            z = torch.complex(x, torch.zeros_like(x))
        spectrum = torch.fft.fft(z, dim=-1)
        return spectrum.abs() + torch.fft.ifft(spectrum * spectrum.conj(), dim=-1).real


# --- 6./7. sizes from Python float arithmetic, sizes traced as tensors ---------------------------

class SizeMath(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, x):  # [B, C, T]
        length = x.shape[-1]
        if self.form == "pad_to_hop":
            frames = math.ceil(length / 4)
            return F.pad(x, (0, frames * 4 - length)).reshape(x.shape[0], x.shape[1], -1, 4).mean(-1)
        new_length = math.floor(3 * length / 2)  # a resampler's output length
        return F.interpolate(x, scale_factor=1.5, mode="linear")[..., :new_length]


class TracedNFFT(nn.Module):
    """``n_fft = 2 * (bins - 1)`` from the spectrum's shape into istft and irfft."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.gain = nn.Linear(9, 9)

    def forward(self, x):  # [B, T] audio
        spec = torch.stft(x, 16, 4, window=torch.hann_window(16), return_complex=True)
        spec = spec * torch.sigmoid(self.gain(spec.abs().transpose(1, 2))).transpose(1, 2)
        n_fft = 2 * (spec.shape[-2] - 1)
        if self.form == "istft":
            return torch.istft(spec, n_fft, hop_length=n_fft // 4, window=torch.hann_window(n_fft),
                               length=x.shape[-1])
        return torch.fft.irfft(spec, n=n_fft, dim=1).sum(1)


# --- 8. helpers compiled inside libraries ---------------------------------------------------------

@torch.jit.script
def _snake(x, alpha):
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


@torch.jit.script
def _pad_to(x, n: int):
    return F.pad(x, [0, n - x.shape[-1]])


@torch.jit.script_if_tracing
def _z_norm(x, dims: List[int], eps: float = 1e-8):
    mean = x.mean(dim=dims, keepdim=True)
    return (x - mean) / (torch.var(x, dim=dims, keepdim=True, unbiased=False) + eps).sqrt()


@torch.jit.script_if_tracing
def _trim_to_stride(x, stride_product):
    """A library's length fix-up: an int() of a constant buffer (scripted under TorchScript)."""
    stride = int(stride_product[0])
    return x[..., :(x.shape[-1] - 1) // stride * stride + 1]


class Scripted(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form
        self.alpha = nn.Parameter(torch.rand(1, 4, 1) + 0.5)

    def forward(self, x):  # [B, 4, T]
        if self.form == "pad_to":
            return _pad_to(x, 2 * x.shape[-1]).cumsum(-1)
        if self.form == "snake":
            return _snake(x, self.alpha)
        if self.form == "complex_argument":  # a spectrum (a real/imaginary pair while exporting) goes in
            spec = _trim_to_stride(torch.fft.rfft(x, dim=1), torch.tensor([2]))
            return spec.abs() * self.alpha[:, :3]
        return _z_norm(x, [1, 2])


# --- 10./11. small op gaps ------------------------------------------------------------------------

class EyeMask(nn.Module):
    def forward(self, x):  # [B, T, D]
        local = torch.eye(x.shape[1], dtype=torch.bool) | torch.eye(x.shape[1], dtype=torch.bool).roll(1, 1)
        scores = (x @ x.transpose(1, 2)).masked_fill(~local, float("-inf"))
        return scores.softmax(-1) @ x


class StridedFrames(nn.Module):
    def forward(self, x):  # [B, T] audio, framed by hand
        batch, length = x.shape
        frames = (length - 8) // 2 + 1
        return x.contiguous().as_strided((batch, frames, 8), (length, 2, 1)) * torch.hann_window(8)


class SqueezeAll(nn.Module):
    def forward(self, x):  # [B, T, D]
        pooled = x.mean(1, keepdim=True)[:, None]  # [B, 1, 1, D]
        return pooled.squeeze() * 2 + torch.squeeze(x[:, :1]).sum(-1, keepdim=True)


# value checks in the forms Python compiles them to (read by checks.check_outcome)

def _assert_form(x):
    assert x, "message"


def _raise_form(x):
    if x:
        raise ValueError(f"bad {x}")
    return 1


def _negated_form(x):
    if not x:
        raise RuntimeError
    return 1


def _branch_form(x):
    if x:
        return 1
    return 2


def _report_form(x):
    if x:
        print("out of range:", x)
    return 1


def _report_else_form(x):
    if x:
        print("out of range:", x)
    else:
        x = 2
    return x


class ReportsRange(nn.Module):
    """torchfcpe's mel extractor: a range check on the input that only reports (print, warnings.warn)."""

    def forward(self, x):
        if torch.min(x) < -10.0:
            print("min value is ", torch.min(x))
        if torch.max(x) > 10.0:
            warnings.warn(f"max value is {torch.max(x).item()}")
        return x.clamp(-1, 1).cumsum(1)


# --- constants read back as numbers, strides read from the tensor (the sweep's asteroid and julius forms) --

@torch.jit.script_if_tracing
def _global_norm(x, eps: float = 1e-8):
    dims: List[int] = torch.arange(1, x.dim()).tolist()  # a function of the rank only
    mean = x.mean(dim=dims, keepdim=True)
    return (x - mean) / (torch.var(x, dim=dims, keepdim=True, unbiased=False) + eps).sqrt()


class GlobalNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(1, 4, 1) + 0.5)

    def forward(self, x):  # [B, 4, T]
        return _global_norm(x) * self.gain


class PadToStrideProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.strides = np.array([2, 3])

    def forward(self, x):  # [B, 4, T]
        product = int(torch.from_numpy(np.cumprod(self.strides))[-1])
        return F.pad(x, (0, (product - x.shape[-1] % product) % product)).cumsum(-1)


class FramesFromStride(nn.Module):
    """Framing written with as_strided, the length rounded up with math.ceil and the row stride read
    from the padded tensor."""

    def forward(self, x):  # [B, T] audio
        length = x.shape[-1]
        frames = math.ceil((max(length, 8) - 8) / 3) + 1
        padded = F.pad(x, (0, (frames - 1) * 3 + 8 - length)).contiguous()
        return padded.as_strided([x.shape[0], frames, 8], [padded.stride(0), 3, 1]) * torch.hann_window(8)


class CoverWithConv(nn.Module):
    """Pad so that a strided conv covers every input sample (codec encoders)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 8, stride=4)

    def forward(self, x):  # [B, T] audio
        length = x.shape[-1]
        covered = (math.ceil((length - 8) / 4 + 1) - 1) * 4 + 8
        return self.conv(F.pad(x[:, None], (0, covered - length)))


# --- issue #39, 1 and 4: the longest of a lengths input read back as a number ---------------------

class _DeclaresLengths(nn.Module):
    """``forward(x, lengths)``, the lengths those of x's dim 1: export()'s adapter declares such an input
    (``data:size1``) while exporting; a bare ``torch.onnx.export`` of these models declares it here alike."""

    declares = True  # False: export()'s adapter declares them

    def forward(self, x, lengths):
        from onnx_compat.patches.lengths import declared
        with declared((x, lengths), {1: (0, 1, "x0:size1")} if self.declares else {}):
            return self.body(x, lengths)


def _pad_mask(lengths):
    """A mask helper of the kind model libraries keep in a utils module, reached from forward by global name."""
    longest = int(torch.max(lengths))
    return torch.arange(longest, device=lengths.device)[None, :] < lengths[:, None]


class LengthsMask(_DeclaresLengths):
    """Masked mean over time, the mask sized by the longest length read back as a number (torchaudio-style
    ``lengths.max().item()``, ``max(lengths)``, ``max(lengths.tolist())``, ``torch.max(lengths)``,
    ``int(lengths.max())``, ``int(torch.max(lengths))`` in a helper function)."""

    def __init__(self, form):
        super().__init__()
        self.form, self.proj = form, nn.Linear(8, 8)

    def body(self, x, lengths):
        longest = {"item": lambda: lengths.max().item(), "builtin": lambda: max(lengths),
                   "tolist": lambda: max(lengths.tolist()), "torch_max": lambda: torch.max(lengths),
                   "int_max": lambda: int(lengths.max()), "int_in_helper": lambda: None}[self.form]()
        mask = _pad_mask(lengths) if longest is None else \
            torch.arange(longest, device=x.device)[None, :] < lengths[:, None]
        return (self.proj(x) * mask[..., None]).sum(1) / lengths[:, None]


def _make_pad_mask(lengths, xs=None, length_dim=-1, maxlen=None):
    """The speech toolkits' padding-mask helper (True at padded frames), in the form they write it: the lengths
    read as a Python list, the batch as its len(), the mask compared with ``new(lengths)``."""
    if not isinstance(lengths, list):
        lengths = lengths.tolist()
    bs = int(len(lengths))
    if maxlen is None:
        if xs is None:
            maxlen = int(max(lengths))
        else:
            maxlen = xs.size(length_dim)
    seq_range = torch.arange(0, maxlen, dtype=torch.int64)
    seq_range_expand = seq_range.unsqueeze(0).expand(bs, maxlen)
    seq_length_expand = seq_range_expand.new(lengths).unsqueeze(-1)
    return seq_range_expand >= seq_length_expand


class PadMaskAttention(_DeclaresLengths):
    """Self-attention whose scores are masked at padded keys by ``_make_pad_mask`` (the mask sized by the
    longest length, or by the input's time size), then a masked mean over time."""

    def __init__(self, sized_by="lengths"):
        super().__init__()
        self.sized_by, self.qkv = sized_by, nn.Linear(8, 24)

    def body(self, x, lengths):
        pad = _make_pad_mask(lengths) if self.sized_by == "lengths" else _make_pad_mask(lengths, x, 1)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)).masked_fill(pad[:, None, :], float("-inf"))
        out = scores.softmax(-1) @ v
        keep = (~pad)[..., None].to(x.dtype)
        return (out * keep).sum(1) / keep.sum(1)


class FramedLengths(_DeclaresLengths):
    """A strided front end whose frame lengths are computed from the sample lengths, the frames then masked by
    those (espnet's STFT: ``olens = (ilens + 2 * pad - n_fft) // hop + 1``, then ``make_pad_mask(olens, ...)``).
    ``form``: how the frame lengths are computed and read (floor division and the list's max; trunc division,
    ``.long()`` and the frames' time size; ceil of a true division and ``max().item()``; ``int(max())``;
    ``torch.arange(max())``; floor division in place on a copy)."""

    def __init__(self, form):
        super().__init__()
        self.form, self.conv = form, nn.Conv1d(8, 8, 4, stride=2, padding=1)  # frames (T + 2 - 4) // 2 + 1
        self.pick = nn.Conv1d(8, 8, 1, stride=2)  # frames (T - 1) // 2 + 1, ceil(T / 2)

    def body(self, x, lengths):
        h = x.transpose(1, 2)
        if self.form == "ceil_item":
            frames, olens = self.pick(h), torch.ceil(lengths / 2).long()
        elif self.form == "trunc_input":
            frames, olens = self.conv(h), torch.div(lengths + 2 - 4, 2, rounding_mode="trunc") + 1
        elif self.form == "in_place":
            frames, olens = self.conv(h), lengths.clone()
            olens -= 2
            olens //= 2
            olens += 1
        else:
            frames, olens = self.conv(h), (lengths - 2) // 2 + 1
        frames = frames.transpose(1, 2)
        if self.form == "ceil_item":
            pad = torch.arange(olens.max().item())[None, :] >= olens[:, None]
        elif self.form == "floor_int":
            pad = torch.arange(int(olens.max()))[None, :] >= olens[:, None]
        elif self.form == "arange_max":
            pad = torch.arange(olens.max())[None, :] >= olens[:, None]
        else:
            pad = _make_pad_mask(olens.long(), frames, 1) if self.form == "trunc_input" else _make_pad_mask(olens)
        keep = (~pad)[..., None].to(x.dtype)
        return (frames * keep).sum(1) / olens[:, None].to(x.dtype)


class MaskedSpectrum(_DeclaresLengths):
    """espnet's STFT encoder and decoder around a mask: frame lengths from the sample lengths
    (``(lengths + 2 * (n_fft // 2) - n_fft) // hop + 1``, trunc division), the spectrum's padded frames zeroed by
    ``_make_pad_mask`` of them sized by the frames, then ``istft(length=lengths.max())``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 17)[:, None])

    def body(self, x, lengths):  # x [B, samples]
        spec = torch.stft(x, 32, 8, window=self.window, return_complex=True)  # [B, 17, frames]
        olens = torch.div(lengths + 2 * 16 - 32, 8, rounding_mode="trunc") + 1
        keep = (~_make_pad_mask(olens.long(), spec.transpose(1, 2), 1)).to(x.dtype)  # [B, frames]
        return torch.istft(spec * (self.gain * keep[:, None, :]), 32, 8, window=self.window, length=lengths.max())


class OffsetLengths(_DeclaresLengths):
    """Left-padding offsets ``T - lengths`` read back as a list: a function that does not keep the longest
    length, so the offsets' values are no function of the padded dim."""

    def body(self, x, lengths):
        offsets = x.size(1) - lengths
        pad = _make_pad_mask(offsets)
        return x[:, :pad.shape[1]].sum(1) * pad.sum(1, keepdim=True)


class CheckedLengths(_DeclaresLengths):
    """The input's time size checked against the longest length (``assert x.size(1) == lengths.max().item()``)
    in a model whose reduction dims come from ``torch.arange(...).tolist()`` (asteroid's global norm), which
    only the non-strict dynamo exporter traces with the patches."""

    def body(self, x, lengths):
        assert x.size(1) == lengths.max().item(), "time size and lengths disagree"
        return _global_norm(x) * lengths[:, None, None]


class TrimmedToLongest(_DeclaresLengths):
    """Reads the longest length and expects it shorter than the padding: under the convention it is not."""

    def body(self, x, lengths):
        return x[:, :lengths.max().item()].sum(1) / lengths[:, None]


class LengthsList(_DeclaresLengths):
    """``lengths.tolist()`` read per sequence: a Python list as long as the batch."""

    def body(self, x, lengths):
        return torch.stack([x[i, :n].mean(0) for i, n in enumerate(lengths.tolist())])


# --- issue #39, 6: .numpy() of a constant, only to read its dtype ---------------------------------

class NumpyDtype(nn.Module):
    """Peak normalisation whose epsilon is the dtype's, read through numpy from a constant made in forward
    or from a buffer."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))

    def forward(self, x):
        source = torch.tensor([1.0, 2.0]) if self.form == "constant" else self.scale
        eps = float(np.finfo(source.numpy().dtype).eps)
        return x / (x.abs().amax(-1, keepdim=True) + eps)


# --- issue #39, 5: a traced size reaching torch.is_tensor -------------------------------------------

def _valid_mask(seq_len, batch, time):
    """An int means every frame is valid; a tensor is a batch of lengths."""
    if torch.is_tensor(seq_len):
        return torch.arange(time, device=seq_len.device)[None, :] < seq_len[:, None]
    return torch.ones(batch, time, dtype=torch.bool)


class SqueezeWide(nn.Module):
    """coqui's ResNet speaker encoder: ``x.squeeze_(1)`` of a dim that is not 1 (a no-op in torch)."""

    def forward(self, x):  # [B, T, 8]
        h = x.transpose(1, 2) * 2.0
        h.squeeze_(1)
        return torch.squeeze(h, 1).cumsum(-1)


class BufferFlags(nn.Module):
    """Small buffers read back as Python values: speechtokenizer's codebook ``if self.inited:``, pesto's
    ``roll(-round(self.shift.cpu().item() * bins))``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inited", torch.tensor([1.0]))
        self.register_buffer("shift", torch.tensor(0.4))
        self.proj = nn.Linear(8, 8)

    def forward(self, x):  # [B, T, 8]
        if self.inited:
            x = self.proj(x)
        return x.roll(-round(self.shift.cpu().item() * 3), -1)


class FrameSolve(nn.Module):
    """diffsptk's mel-cepstral analysis: one small symmetric Toeplitz system per frame, solved for a vector
    (or for two right-hand sides)."""

    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, x):  # [B, T, 6]
        r = torch.cat([x[..., :1].abs() + 3.0, x[..., 1:]], -1)
        R = r[..., (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs()]
        if self.form == "vector":
            return torch.linalg.solve(R, x)
        return torch.linalg.solve(R, x.unsqueeze(-1) * torch.tensor([1.0, -2.0]))


class KernelSizedWindows(nn.Module):
    """coqui UnivNet's location-variable convolution: windows as wide as a kernel, the width read from the
    kernel's shape (a traced size under TorchScript)."""

    def forward(self, x, kernel):  # [B, C, T], [B, K]
        width = kernel.shape[-1]
        return (x.unfold(2, width, 1) * kernel[:, None, None, :]).sum(-1)


class Int32LengthsSquare(nn.Module):
    """espnet's traceable ``make_pad_mask``: rows of a triangle of ones sized by ``lengths.max() + 1``, the
    lengths int32."""

    def forward(self, x, lengths):  # [B, T, 8], int32 [B] whose longest fills T
        maxlen = lengths.max()
        triangle = torch.ones(maxlen + 1, maxlen + 1, dtype=torch.bool).triu(1)[1:, :-1]
        padded = triangle[(lengths - 1).long()][..., :maxlen]
        return x.masked_fill(padded[..., None], 0.0).sum(1)


class DivmodSize(nn.Module):
    """pesto-style: a size read back as a number where it is a tensor ("JIT" guard), then split with divmod."""

    def forward(self, x):  # [B, T, 8]
        T = x.size(1)
        if torch.is_tensor(T):
            T = T.item()
        groups, rest = divmod(T, 4)
        x = F.pad(x, (0, 0, 0, (4 - rest) % 4))
        return x.reshape(x.shape[0], -1, 4, 8).mean(2) * groups


class IntOrLengths(nn.Module):
    def forward(self, x):  # [B, T, D]; the full length passed as an int
        mask = _valid_mask(x.shape[1], x.shape[0], x.shape[1])
        return (x * mask[..., None]).cumsum(1)


# --- issue #39, 2: complex tensors the spectral patches did not see -------------------------------

class ComplexBuffer(nn.Module):
    """Rotary embedding with its frequencies as a complex buffer made by ``torch.polar``, read back with
    ``view_as_real``."""

    def __init__(self):
        super().__init__()
        angles = torch.arange(64.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.03])
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):  # [B, T, 8], T <= 64
        B, T, _ = x.shape
        z = torch.view_as_complex(x.reshape(B, T, 4, 2))
        return torch.view_as_real(z * self.freqs[:T]).flatten(2)


class RotaryQuery(nn.Module):
    """A Llama-style rotary embedding on an attention query: ``freqs_cis`` a complex buffer made with
    ``torch.polar`` in ``__init__`` (not in the state dict), the heads' pairs taken with ``view_as_complex``,
    multiplied by the buffer's first T rows shaped to broadcast, and read back with ``view_as_real``."""

    def __init__(self, heads=2, dim=4, max_len=64):
        super().__init__()
        self.heads, self.q = heads, nn.Linear(8, heads * dim)
        inverse = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(max_len).float(), inverse)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, x):  # [B, T, 8], T <= 64
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.heads, -1)
        pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        freqs = self.freqs_cis[:T].view(1, T, 1, pairs.shape[-1])
        return torch.view_as_real(pairs * freqs).flatten(3).type_as(x)


class ComplexPadUnfold(nn.Module):
    """``view_as_complex``, then ``F.pad`` (zero or reflect) and ``unfold`` over time on the complex spectrum."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, x):  # [B, T, 8]
        B, T, _ = x.shape
        z = torch.view_as_complex(x.reshape(B, T, 4, 2)).transpose(1, 2)
        z = F.pad(z, (2, 2), mode=self.mode)
        weights = torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1])
        return torch.view_as_real((z.unfold(-1, 5, 1) * weights).sum(-1)).flatten(2)


# --- issue #39, 8: a length regulator looping over the batch --------------------------------------

class BatchLengthRegulator(nn.Module):
    """FastSpeech-style: each utterance expanded by its durations on its own (iterating the batch, or its
    ``unbind()``), then padded."""

    def __init__(self, form="zip"):
        super().__init__()
        self.form = form

    def forward(self, x, durations):  # [B, T, D], [B, T] -> [B, max total duration, D]
        from torch.nn.utils.rnn import pad_sequence
        if self.form == "unbind":
            rows = zip(x.unbind(0), torch.unbind(durations))
            return pad_sequence([h.repeat_interleave(d, dim=0) for h, d in rows], batch_first=True)
        return pad_sequence([torch.repeat_interleave(h, d, dim=0) for h, d in zip(x, durations)],
                            batch_first=True, padding_value=-1.0)


# --- the same regulator padded by hand, guarded against all-zero durations (espnet's FastSpeech) -----------

def pad_into_buffer(rows, pad_value, form="new_fill"):
    """A list of ``[T_i, D]`` rows padded into a fresh ``[B, max T_i, D]`` buffer, one slice store per row
    (espnet's ``pad_list``; ``new_zeros``/``new_full``: the same with the buffer made filled)."""
    n_batch = len(rows)
    max_len = max(x.size(0) for x in rows)
    if form == "new_zeros":  # padded with zeros whatever pad_value says
        pad = rows[0].new_zeros(n_batch, max_len, *rows[0].size()[1:])
    elif form == "new_full":
        pad = rows[0].new_full((n_batch, max_len) + tuple(rows[0].shape[1:]), pad_value)
    elif form == "torch_zeros":  # a buffer of len(rows) rows, not made from a row
        pad = torch.zeros(n_batch, max_len, *rows[0].size()[1:], dtype=rows[0].dtype)
    else:
        pad = rows[0].new(n_batch, max_len, *rows[0].size()[1:]).fill_(pad_value)
    order = range(n_batch)
    if form == "interleaved":  # even rows, then odd ones: not the order a batched store can stand for
        order = list(range(0, n_batch, 2)) + list(range(1, n_batch, 2))
    for i in order:
        pad[i, :rows[i].size(0)] = rows[i]
    return pad


class PaddedByHandRegulator(nn.Module):
    """A FastSpeech length regulator as espnet writes it: all-zero durations repaired in a branch on their
    sum (a warning and a masked store; ``repair="rebound"``: a body that binds a name instead, ``"none"``: no
    branch), each utterance expanded on its own, padded by hand."""

    def __init__(self, form="new_fill", pad_value=0.0, repair="masked"):
        super().__init__()
        self.form, self.pad_value, self.repair = form, pad_value, repair
        self.proj = nn.Linear(8, 8)

    def forward(self, x, durations):  # [B, T, 8], [B, T] -> [B, max total duration, 8]
        ds = durations.clone()  # the repair writes into it; the caller's tensor stays as it was
        ds = {"masked": self.repaired, "rebound": self.rebound, "none": lambda d: d}[self.repair](ds)
        rows = [torch.repeat_interleave(h, d, dim=0) for h, d in zip(self.proj(x), ds)]
        return pad_into_buffer(rows, self.pad_value, self.form)

    @staticmethod
    def repaired(ds):
        if ds.sum() == 0:
            warnings.warn("all durations are 0: each utterance's are set to 1")
            ds[ds.sum(dim=1).eq(0)] = 1
        return ds

    @staticmethod
    def rebound(ds):  # a body that binds a name: real control flow
        if ds.sum() == 0:
            ds = ds + 1
        return ds


class RepairedDurations(nn.Module):
    """The repairing branch alone: durations of all zeros set to one per token, then used as frame weights."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, durations):  # [B, T, 8], [B, T] -> [B, T, 8]
        ds = PaddedByHandRegulator.repaired(durations.clone())
        return self.proj(x) * ds[..., None]


# which branch of ``if ...:`` is a repair (bytecode forms; ``checks.repair_entry``)

def _repair_form(ds):
    if ds.sum() == 0:
        warnings.warn("all zero")
        ds[ds.sum(dim=1).eq(0)] = 1
    return ds


def _repair_negated_form(ds):
    if not ds.any():
        ds[0] = 1
    return ds


def _repair_else_form(ds):
    if ds.sum() == 0:
        ds[0] = 1
    else:
        ds[1] = 2
    return ds


def _rebind_form(ds):
    if ds.sum() == 0:
        ds = ds + 1
    return ds


def _augmented_form(ds):
    if ds.sum() == 0:
        ds[:, 0] += 1
    return ds


def _in_place_call_form(ds):
    if ds.sum() == 0:
        ds[0] = ds[1].clamp_(min=1)
    return ds


def _call_form(ds):
    if ds.sum() == 0:
        ds[0] = 1
        np.copyto(ds.numpy(), 1)
    return ds
