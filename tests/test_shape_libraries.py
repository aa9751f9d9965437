"""Shape libraries while exporting (issue #24, pattern 9): einx's elementwise ops with batch and time
dynamic, and einops on the complex values of the spectral patches. Small models of our own in several
forms (relative positions, masks from lengths, output groups, ellipses; a band mask between stft and
istft, a mask averaged with scatter_add), exported under ``patched()`` and compared with the unpatched
eager model at new batch and length sizes (B=1 too); the vanilla failure is asserted where torch 2.13
has it."""
import pytest
import torch
import torch.nn as nn

import onnx_compat
from onnx_compat.patches.shape_libraries import ELEMENTWISE, elementwise
from onnx_compat.testing import patch_case_tests

from helpers import pattern_cases

einx = pytest.importorskip("einx")
einops = pytest.importorskip("einops")


class RelativePositions(nn.Module):
    """A T5/ALiBi-style bias: |i - j| from two aranges, through an embedding, onto attention scores."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Embedding(64, 1)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        distance = einx.subtract("j, i -> i j", pos, pos).abs().clamp(max=63)
        scores = torch.einsum("bid,bjd->bij", x, x) + self.bias(distance)[..., 0]
        return self.proj(scores.softmax(-1) @ x)


class MaskFromLengths(nn.Module):
    """A padding mask made by comparing an arange with the lengths, then einx.where onto the features."""

    def forward(self, x, lengths):
        mask = einx.less("t, b -> b t", torch.arange(x.shape[1]), lengths)
        kept = einx.where("b t, b t d, -> b t d", mask, x, 0.0)
        return kept * 2.0 + einx.multiply("b t, b t d -> b t d", mask.float(), x)


class GroupsAndEllipsis(nn.Module):
    """Streams added and folded into the batch ``(b s)``, an ellipsis, and the no-arrow shorthand."""

    def __init__(self):
        super().__init__()
        self.streams = nn.Parameter(torch.randn(3, 8))
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        y = einx.add("b t d, s d -> (b s) t d", x, self.streams)
        y = einx.multiply("... d, d", y, self.scale)
        gate = einx.greater("... t d, ... t -> ... t d", y, y.mean(-1))
        return einx.where("..., ..., ...", gate, y, -y)


class BandMask(nn.Module):
    """stft, einops rearranges of the complex spectrogram around a real mask, istft (band-split models)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.mask = nn.Sequential(nn.Linear(17, 17), nn.Sigmoid())

    def forward(self, wave):
        spec = torch.stft(wave, 32, 8, window=self.window, return_complex=True)
        spec = einops.rearrange(spec, "b f t -> b t f")
        spec = spec * self.mask(spec.abs())
        spec = einops.rearrange(spec, "b t f -> b f t")
        return torch.istft(spec, 32, 8, window=self.window, length=wave.shape[-1])


class AveragedMask(nn.Module):
    """view_as_complex, einops.repeat to stems, zeros_like(...).scatter_add_ to average overlapping bands,
    index_fill of the DC bin, einops.reduce over the stems (mel-band models)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.register_buffer("index", torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                                    4, 5, 6, 7, 8, 9, 10, 11, 12]))
        self.mask = nn.Linear(34, 2 * 26)

    def forward(self, wave):
        spec = torch.view_as_real(torch.stft(wave, 32, 8, window=self.window, return_complex=True))
        masks = einops.rearrange(self.mask(einops.rearrange(spec, "b f t c -> b t (f c)")),
                                 "b t (f c) -> b f t c", c=2)
        spec, masks = torch.view_as_complex(spec.contiguous()), torch.view_as_complex(masks.contiguous())
        stems = einops.repeat(spec, "b f t -> b n f t", n=2)
        index = einops.repeat(self.index, "f -> b n f t", b=wave.shape[0], n=2, t=spec.shape[-1])
        summed = torch.zeros_like(stems).scatter_add_(2, index, einops.repeat(masks, "b f t -> b n f t", n=2))
        averaged = einops.reduce(stems * summed, "b n f t -> b f t", "sum").index_fill(1, torch.tensor([0]), 0.0)
        return torch.istft(averaged, 32, 8, window=self.window, length=wave.shape[-1])


def _features(B, T, g):
    return (torch.randn(B, T, 8, generator=g),)


def _with_lengths(B, T, g):
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.randn(B, T, 8, generator=g), lengths


def _wave(B, T, g):
    return (torch.randn(B, 8 * T, generator=g),)


# name: (model, inputs(B, T, generator), dynamic axes, exporters, failure per exporter on 2.13 without the
# patch: vanilla for einx; for einops, under the other patches (vanilla stops earlier, at the complex stft)
CASES = {
    "einx_relative_positions": (RelativePositions, _features, {0: {0: "b", 1: "t"}}, ("torchscript", "dynamo"),
                                {"torchscript": ("mismatch", "Expand", "Reshape", "broadcast")}),
    "einx_mask_from_lengths": (MaskFromLengths, _with_lengths, {0: {0: "b", 1: "t"}, 1: {0: "b"}},
                               ("torchscript",), {"torchscript": ("mismatch", "Expand", "Reshape", "broadcast")}),
    "einx_groups_and_ellipsis": (GroupsAndEllipsis, _features, {0: {0: "b", 1: "t"}}, ("torchscript", "dynamo"),
                                 {"torchscript": ("mismatch", "Expand", "Reshape", "broadcast")}),
    "einops_complex_band_mask": (BandMask, _wave, {0: {0: "b", 1: "t"}}, ("torchscript",),
                                 {"torchscript": "Tensor type unknown to einops"}),
    "einops_complex_averaged_mask": (AveragedMask, _wave, {0: {0: "b", 1: "t"}}, ("torchscript", "dynamo"),
                                     {"torchscript": "Tensor type unknown to einops"}),
}
SIZES = [(1, 23), (3, 50), (2, 9)]


def _without_einops_complex(name):
    """einops' cases fail without the einops patch under the other patches (vanilla stops earlier)."""
    return (lambda: onnx_compat.patched(exclude=["einops_complex"])) if name.startswith("einops") else None


# recorded on torch 2.13 with einx 0.4.3 and einops 0.8.2
PATTERN_CASES = pattern_cases(CASES, SIZES, _without_einops_complex)
test_patched_export_matches_eager, test_without_the_patch_export_fails_as_recorded = patch_case_tests(PATTERN_CASES)


@pytest.mark.parametrize("case", PATTERN_CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    case.assert_eager_untouched()


# --- the einx forms one by one, against einx itself ---------------------------------------------

FORMS = [
    ("subtract", "... j, ... i -> ... i j", [(2, 3), (2, 4)]),
    ("subtract", "j, i -> 1 i j", [(3,), (4,)]),
    ("add", "b n d, s d -> (b s) n d", [(2, 3, 5), (4, 5)]),
    ("add", "b n d, d", [(2, 3, 5), (5,)]),
    ("multiply", "b n h, b h n d -> b h n d", [(2, 3, 4), (2, 4, 3, 5)]),
    ("add", "b 1 d, n d -> b n d", [(2, 1, 5), (3, 5)]),
    ("less", "i, j -> (i j)", [(3,), (4,)]),
    ("maximum", "a b c, c b a, b -> a b c", [(2, 3, 4), (4, 3, 2), (3,)]),
    ("true_divide", "a, b -> a () b", [(2,), (3,)]),
]


@pytest.mark.parametrize("op,description,shapes", FORMS)
def test_einx_forms_match_einx(op, description, shapes):
    g = torch.Generator().manual_seed(len(description))
    tensors = [torch.rand(*s, generator=g) + 0.5 for s in shapes]
    got = elementwise(ELEMENTWISE[op], description, tensors)
    want = getattr(einx, op)(description, *tensors)
    assert got is not None, f"{description}: left to einx"
    assert got.shape == want.shape and torch.equal(got, want), f"{description}: {got.shape} vs {want.shape}"


@pytest.mark.parametrize("description,shapes", [
    ("b [t] d -> b d", [(2, 3, 4)]),            # brackets: a reduction, einx's own
    ("(b s) t, s -> b s t", [(6, 3), (3,)]),    # a group in an operand needs a size
    ("b t, b t -> b t k", [(2, 3), (2, 3)]),    # an output axis no operand has
    ("b i i -> b i", [(2, 3, 3)]),              # a repeated axis (a diagonal)
])
def test_forms_outside_the_patch_go_to_einx(description, shapes):
    tensors = [torch.rand(*s) for s in shapes]
    assert elementwise(ELEMENTWISE["add"], description, tensors) is None


def test_axis_sizes_given_as_keywords_go_to_einx():
    x = torch.rand(6, 3)
    with onnx_compat.patched():
        got = einx.add("(b s) t, t -> b s t", x, torch.rand(3), s=2)
    assert got.shape == (3, 2, 3)
