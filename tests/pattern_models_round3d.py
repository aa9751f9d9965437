"""Small models of issue #47's round-three fixes (OCR, time series, NLP first contact): a line recogniser's lengths
rescaled by a ratio of widths taken through Python's ``float()`` (kraken's VGSL). Used by test_float_sizes.py.

Kept out of the test modules, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class WidthRatioLengths(nn.Module):
    """kraken's VGSL line recogniser (kraken/lib/layers.py:320): a conv stack pools the line's width, a reshape
    folds the height into the channels, and the lengths follow the width by the ratio of the widths as Python
    floats, ``(seq_len * (float(initial_len) / o.shape[3])).int()``; the frames past each length are masked.
    ``form``: "ratio" scales the input-width lengths to frames (``lengths / (float(W) / o.shape[3])``); "kraken"
    is kraken's own line, the ratio of the width before the reshape to the width after it (1.0); "derived" takes
    ``float()`` of a width computed from the input's (``(W - 1) // 2 + 1``, a strided conv's output)."""

    def __init__(self, form="ratio"):
        super().__init__()
        self.form = form
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.proj = nn.Linear(16, 5)

    def forward(self, x, lengths):  # x [B, 1, 8, W], lengths [B] in input columns -> [B, frames, 5], lengths
        initial = x.shape[3]
        o = self.pool(F.relu(self.conv(x)))  # [B, 4, 4, W // 2]
        if self.form == "kraken":
            lengths = (lengths.float() / 2).floor().long()  # the pool's lengths, as kraken's MaxPool layer
            initial = o.shape[3]
        o = o.reshape(o.shape[0], 16, 1, o.shape[3])  # kraken's S layer: the height into the channels
        if self.form == "ratio":
            lengths = (lengths / (float(initial) / o.shape[3])).int()
        elif self.form == "kraken":
            lengths = (lengths * (float(initial) / o.shape[3])).int()
        else:  # "derived": float() of an integer size computed from the input's
            lengths = (lengths * (float((initial - 1) // 2 + 1) / initial)).int()
        frames = self.proj(o.squeeze(2).transpose(1, 2))
        mask = torch.arange(frames.shape[1], device=x.device)[None, :] < lengths[:, None]
        return frames.masked_fill(~mask[..., None], 0.0), lengths


class FloatKinds(nn.Module):
    """``float()`` of a traced size, of an integer size computed from one, of a value that is no size and of a
    Python number, the kind of each result put in the list ``seen``; the output scales a range of the width by a ratio of
    sizes (float32 in eager, as a Python float scalar leaves an integer tensor)."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen  # filled in place: the exporters put the module's attributes back

    def forward(self, x):  # [B, T] -> [T]
        width = x.shape[1]
        self.seen[:] = [type(float(width)), type(float((width - 1) // 2 + 1)), type(float(x.sum())),
                     type(float(3)), type(float("2.5"))]
        return torch.arange(width) * (float(width) / x.shape[0]) + x.mean(0)


# a table of helpers the walk of the model's functions does not reach (no global name calls them)
_RATIOS = {"frames": lambda width, frames: float(width) / frames}


class UnreachedRatio(nn.Module):
    """``float()`` of a dynamic size in a helper the ``float`` redirection does not reach."""

    def forward(self, x):  # [B, T] -> [B, T]
        return x * _RATIOS["frames"](x.shape[1], 2)
