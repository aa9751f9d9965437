"""The pure padding arithmetic, checked against what eager PyTorch does."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from onnx_compat.patches._padding import as_tuple, f_pad_arg, is_symmetric, same_pads, symmetric_padding, valid_output_length


def test_formula_examples():
    assert same_pads(5) == ((2, 2),)
    assert same_pads(4) == ((1, 2),)           # the odd element goes right
    assert same_pads(4, 3) == ((4, 5),)        # dilation 3: total 9
    assert same_pads(3, 2) == ((2, 2),)
    assert same_pads((2, 5), (1, 2)) == ((0, 1), (4, 4))
    assert is_symmetric(((2, 2), (1, 1))) and not is_symmetric(((2, 2), (0, 1)))
    assert f_pad_arg(((0, 1), (4, 4))) == (4, 4, 0, 1)  # last dim first
    assert symmetric_padding(((2, 2), (1, 1))) == (2, 1)
    with pytest.raises(ValueError):
        symmetric_padding(((0, 1),))
    with pytest.raises(ValueError):
        same_pads(0)
    assert as_tuple(3, 2) == (3, 3) and as_tuple([2], 3) == (2, 2, 2)
    with pytest.raises(ValueError, match="dilation"):
        as_tuple((1, 2), 3, "dilation")


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@settings(max_examples=40, deadline=None)
@given(ndim=st.integers(1, 3), data=st.data())
def test_explicit_pads_reproduce_eager_same(ndim, data):
    kernel = tuple(data.draw(st.integers(1, 6)) for _ in range(ndim))
    dilation = tuple(data.draw(st.integers(1, 4)) for _ in range(ndim))
    size = tuple(data.draw(st.integers(1, 9)) for _ in range(ndim))
    torch.manual_seed(0)
    x = torch.randn(2, 3, *size)
    w = torch.randn(4, 3, *kernel)
    conv = _CONV[ndim]
    expected = conv(x, w, padding="same", dilation=dilation)
    pads = same_pads(kernel, dilation)
    got = conv(F.pad(x, f_pad_arg(pads)), w, dilation=dilation)
    assert got.shape == expected.shape == (2, 4, *size)
    torch.testing.assert_close(got, expected)
    if is_symmetric(pads):
        torch.testing.assert_close(conv(x, w, padding=symmetric_padding(pads), dilation=dilation), expected)


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 40), kernel=st.integers(1, 7), dilation=st.integers(1, 3), stride=st.integers(1, 3))
def test_valid_length_matches_eager(length, kernel, dilation, stride):
    x = torch.randn(1, 1, length)
    w = torch.randn(1, 1, kernel)
    expected_len = valid_output_length(length, kernel, dilation, stride)
    if expected_len == 0:
        with pytest.raises(RuntimeError):
            F.conv1d(x, w, padding="valid", dilation=dilation, stride=stride)
        return
    assert F.conv1d(x, w, padding="valid", dilation=dilation, stride=stride).shape[-1] == expected_len
