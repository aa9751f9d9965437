"""Small models of issue #47 item 9's second half (the Demucs family, DeepFilterNet3), each with the code form
of the library line it stands for. Used by test_item9_spectral.py.

Kept out of the test modules, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def center_trim(tensor, reference):
    """demucs/utils.py:39's form: trim the last dim to ``reference`` (a tensor's last dim, or a length),
    ``delta`` samples cut as ``[..., delta // 2:-(delta - delta // 2)]`` behind ``if delta:``."""
    if isinstance(reference, torch.Tensor):
        ref_size = reference.size(-1)
    else:
        ref_size = reference
    delta = tensor.size(-1) - ref_size
    if delta < 0:
        raise ValueError(f"tensor must be larger than reference. Delta is {delta}.")
    if delta:
        tensor = tensor[..., delta // 2:-(delta - delta // 2)]
    return tensor


class CenterTrimmed(nn.Module):
    """A strided conv U-net step in demucs v2's form: padded (branch-free) to a length the convs take whole,
    encoded and decoded, then centre-trimmed back to the input's length by a tensor reference
    (``center_trim(x, mix)``). At lengths the convs take whole the trim is 0 samples (T = 16 k + 4 here), where
    ``x[..., 0:-0]`` would be empty."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv1d(1, 4, 8, stride=4)
        self.mid = nn.Conv1d(4, 4, 3, padding=1)
        self.up = nn.ConvTranspose1d(4, 2, 8, stride=4)

    def forward(self, mix):  # [B, 1, T] -> [B, 2, T]
        length = mix.shape[-1]
        pad = (math.ceil((length - 8) / 4) * 4 + 8) - length  # to (n - 1) * 4 + 8 samples, demucs' valid_length
        x = F.pad(mix, (pad // 2, pad - pad // 2))
        skip = torch.tanh(self.down(x))
        x = self.up(F.gelu(self.mid(skip)) + skip)
        return center_trim(x, mix)


class DeepFilter(nn.Module):
    """DeepFilterNet's deep filter (df/multiframe.py:136): complex coefficients over the current and ``order - 1``
    past frames of a complex spectrum, applied with ``torch.einsum("...tfn,...ntf->...tf", spec, coefs)`` on two
    complex tensors; the spectrum comes and goes as a ``[B, T, F, 2]`` real view."""

    def __init__(self, freqs: int = 12, order: int = 3):
        super().__init__()
        self.order = order
        self.coefs = nn.Linear(2 * freqs, 2 * freqs * order)

    def forward(self, spec):  # [B, T, F, 2] -> [B, T, F, 2]
        B, T, Fq, _ = spec.shape
        coefs = self.coefs(spec.flatten(2)).view(B, T, self.order, Fq, 2).permute(0, 2, 1, 3, 4)
        coefs = torch.view_as_complex(coefs.contiguous())  # [B, N, T, F]
        z = torch.view_as_complex(spec.contiguous())
        frames = F.pad(z.permute(0, 2, 1), (self.order - 1, 0)).unfold(-1, self.order, 1)  # [B, F, T, N]
        out = torch.einsum("...ftn,...ntf->...tf", frames, coefs)
        return torch.view_as_real(out)


class ValidLength(nn.Module):
    """demucs v2's size code (demucs/demucs.py:376-397, 412, 434): the input padded to the nearest length its
    strided convs take whole, computed by ``math.ceil``/``max(1, ...)`` per layer and ended by ``int(length)``,
    then centre-trimmed back with an int reference (``center_trim(x, length)``, utils.py:46 takes a tensor or a
    length)."""

    def __init__(self, depth: int = 2, kernel: int = 8, stride: int = 4):
        super().__init__()
        self.depth, self.kernel, self.stride = depth, kernel, stride
        self.down = nn.ModuleList(nn.Conv1d(1 if i == 0 else 4, 4, kernel, stride) for i in range(depth))
        self.up = nn.ModuleList(nn.ConvTranspose1d(4, 4 if i < depth - 1 else 2, kernel, stride)
                                for i in range(depth))

    def valid_length(self, length):
        for _ in range(self.depth):
            length = math.ceil((length - self.kernel) / self.stride) + 1
            length = max(1, length)
        for _ in range(self.depth):
            length = (length - 1) * self.stride + self.kernel
        return int(length)

    def forward(self, mix):  # [B, 1, T] -> [B, 2, T]
        length = mix.shape[-1]
        delta = self.valid_length(length) - length
        x = F.pad(mix, (delta // 2, delta - delta // 2))
        for conv in self.down:
            x = torch.tanh(conv(x))
        for conv in self.up:
            x = conv(x)
        return center_trim(x, length)
