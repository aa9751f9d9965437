"""Small sequence models for the pipeline tests."""
import torch
from torch import nn

from onnx_compat import Dim, TensorSpec


def mask_of(x, lengths):
    return torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]


class Subsample(nn.Module):
    """Conv1d stride 2 ("valid" padding): output lengths (L - 3) // 2 + 1, computed, not copied."""

    def __init__(self, features=8, classes=5):
        super().__init__()
        self.conv = nn.Conv1d(features, 16, 3, stride=2, padding="valid")
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, classes)

    def forward(self, data, lengths):
        y = self.conv(data.transpose(1, 2)).transpose(1, 2)
        out_lengths = (lengths - 3) // 2 + 1
        y = y * mask_of(y, out_lengths)[..., None]
        return self.out(self.norm(y)).log_softmax(-1), out_lengths


def subsample_specs(features=8, classes=5):
    batch, time = Dim("batch"), Dim("time", min=8)
    return ([TensorSpec("data", [batch, time, features], lengths=[1])],
            [TensorSpec("output", [batch, Dim("time_sub"), classes], lengths=[1])])


class NamedArgs(nn.Module):
    """forward(features, feature_lengths): mapped by name, not position."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, feature_lengths, features):
        y = self.drop(self.lin(features)) * mask_of(features, feature_lengths)[..., None]
        return y, feature_lengths


def named_specs(lengths_dtype=torch.int32):
    batch, time = Dim("batch"), Dim("time")
    return ([TensorSpec("data", [batch, time, 6], lengths=[1], arg="features",
                        length_args={1: "feature_lengths"}, lengths_dtype=lengths_dtype)],
            [TensorSpec("output", [batch, time, 4], lengths=[1], lengths_dtype=lengths_dtype)])
