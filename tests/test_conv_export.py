"""conv_padding: both exporters, ONNX Runtime vs the unpatched eager model at new shapes."""
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

import onnx_compat
from onnx_compat import versions


from helpers import EXPORTERS, assert_matches, auto_pads, export, needs_dynamo, run, vanilla_string_padding_failure


class Functional(nn.Module):
    """F.convNd with string padding, as user code calls it."""

    def __init__(self, weight_shape, padding, dilation, bias=True, groups=1):
        super().__init__()
        self.padding, self.dilation, self.groups = padding, dilation, groups
        self.weight = nn.Parameter(torch.randn(*weight_shape) * 0.3)
        self.bias = nn.Parameter(torch.randn(weight_shape[0])) if bias else None

    def forward(self, x):
        conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[self.weight.dim()]  # looked up per call
        return conv(x, self.weight, self.bias, padding=self.padding, dilation=self.dilation, groups=self.groups)


C = 4
# name -> (module factory, spatial rank)
CASES = {
    "1d_k5": (lambda: nn.Conv1d(C, 6, 5, padding="same"), 1),
    "1d_even_k4": (lambda: nn.Conv1d(C, 6, 4, padding="same"), 1),
    "1d_k3_d2": (lambda: nn.Conv1d(C, 6, 3, padding="same", dilation=2), 1),
    "1d_k4_d3_no_bias": (lambda: nn.Conv1d(C, 6, 4, padding="same", dilation=3, bias=False), 1),
    "1d_depthwise_k31": (lambda: nn.Conv1d(C, C, 31, padding="same", groups=C), 1),
    "1d_valid_stride2": (lambda: nn.Conv1d(C, 6, 3, padding="valid", stride=2, dilation=2), 1),
    "1d_reflect_k4_d2": (lambda: nn.Conv1d(C, 6, 4, padding="same", dilation=2, padding_mode="reflect"), 1),
    "1d_functional_d2": (lambda: Functional((6, C, 4), "same", 2, bias=False), 1),
    "2d_k2x5_d1x2": (lambda: nn.Conv2d(C, 6, (2, 5), padding="same", dilation=(1, 2)), 2),
    "2d_functional_d3_depthwise": (lambda: Functional((C, 1, 3, 3), "same", 3, groups=C), 2),
    "3d_k3x2x3_d2x1x1": (lambda: nn.Conv3d(C, 5, (3, 2, 3), padding="same", dilation=(2, 1, 1)), 3),
    "3d_functional_valid": (lambda: Functional((5, C, 2, 3, 2), "valid", 1), 3),
}
EXPORT_SIZES = {1: (37,), 2: (13, 17), 3: (6, 7, 8)}
CHECK_SIZES = {1: [(1, 23), (3, 50)], 2: [(1, 9, 20), (3, 16, 11)], 3: [(1, 5, 9, 4), (3, 8, 6, 10)]}


def _dynamic(rank):
    return {0: {0: "batch", **{2 + i: f"s{i}" for i in range(rank)}}}


def _build(name):
    torch.manual_seed(sum(map(ord, name)))
    factory, rank = CASES[name]
    return factory().eval(), rank


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_patched_export_matches_eager_at_new_shapes(name, exporter):
    model, rank = _build(name)
    with onnx_compat.patched():
        proto = export(model, (torch.randn(2, C, *EXPORT_SIZES[rank]),), exporter, _dynamic(rank))
    assert auto_pads(proto) == []
    for batch, *size in CHECK_SIZES[rank]:
        assert_matches(proto, model, torch.randn(batch, C, *size))


def test_vanilla_torchscript_export_of_dilated_same_fails_in_onnxruntime():
    """The failure the patch removes: auto_pad SAME_UPPER with dilation."""
    model, _ = _build("1d_k3_d2")
    proto = vanilla_string_padding_failure(model, (torch.randn(2, C, 37),), _dynamic(1))
    if proto is not None:
        with pytest.raises(Exception, match="[Dd]ilation"):
            run(proto, torch.randn(1, C, 23).numpy())


def test_symmetric_case_has_no_pad_node_and_asymmetric_one_has():
    for name, expect_pad in (("1d_k3_d2", False), ("1d_k4_d3_no_bias", True)):
        model, _ = _build(name)
        with onnx_compat.patched():
            proto = export(model, (torch.randn(2, C, 37),), "torchscript", _dynamic(1))
        ops = [n.op_type for n in proto.graph.node]
        assert ops.count("Conv") == 1 and ("Pad" in ops) == expect_pad, ops


@needs_dynamo
def test_patch_leaves_dynamo_exports_alone():
    """dynamo writes asymmetric pads itself; the patch must not add a Pad node there."""
    model, _ = _build("1d_k4_d3_no_bias")
    with onnx_compat.patched():
        proto = export(model, (torch.randn(2, C, 37),), "dynamo", _dynamic(1))
    assert [n.op_type for n in proto.graph.node] == ["Conv"]


@pytest.mark.parametrize("kwargs", [{"padding": "sideways"}, {"padding": "same", "stride": 2}],
                         ids=["unknown_padding", "same_with_stride"])
def test_bad_padding_raises_pytorchs_own_error(kwargs):
    w = torch.randn(4, C, 3)

    class Bad(nn.Module):
        def forward(self, x):
            return F.conv1d(x, w, **kwargs)

    x = torch.randn(2, C, 11)
    with pytest.raises(RuntimeError) as eager:
        Bad()(x)
    with onnx_compat.patched(), pytest.raises(RuntimeError) as exported:
        export(Bad(), (x,), "torchscript", _dynamic(1))
    assert str(eager.value).splitlines()[0] in str(exported.value)


@functools.lru_cache(maxsize=None)
def _modes():
    """Padding modes whose vanilla export works with dynamic sizes on this torch
    (torch 2.0 cannot export a circular pad of a dynamic dim; not our patch's path)."""
    modes = ["zeros", "zeros", "reflect", "replicate"]
    try:
        conv = nn.Conv1d(2, 2, 3, padding=1, padding_mode="circular").eval()
        export(conv, (torch.randn(2, 2, 9),), "torchscript", _dynamic(1))
        modes.append("circular")
    except Exception:  # only torch 2.0 is known to refuse it; anywhere else the failure is the test's
        if versions.torch_at_least("2.1"):
            raise
    return modes


def _draw_conv(draw):
    rank = draw(st.integers(1, 2))
    groups = draw(st.sampled_from([1, 2]))
    cin = 2 * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    dilation = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    padding = draw(st.sampled_from(["same", "valid"]))
    mode = draw(st.sampled_from(_modes())) if padding == "same" else "zeros"
    conv = (nn.Conv1d, nn.Conv2d)[rank - 1](cin, 2 * groups, kernel, padding=padding, dilation=dilation,
                                             groups=groups, bias=draw(st.booleans()), padding_mode=mode)
    return conv.eval(), rank, kernel, dilation


def _check_drawn(data):
    model, rank, kernel, dilation = data.draw(st.composite(lambda draw: _draw_conv(draw))())
    reach = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    sizes = [tuple(r + data.draw(st.integers(1, 6)) for r in reach) for _ in range(3)]
    cin = model.in_channels
    with onnx_compat.patched():
        proto = export(model, (torch.randn(2, cin, *sizes[0]),), "torchscript", _dynamic(rank))
    assert auto_pads(proto) == []
    assert_matches(proto, model, torch.randn(1, cin, *sizes[1]))
    assert_matches(proto, model, torch.randn(3, cin, *sizes[2]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_convs_torchscript(data):
    _check_drawn(data)


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_random_convs_torchscript(data):
    _check_drawn(data)


def test_even_kernel_same_padding_is_one_pad_with_constant_pads_under_torchscript():
    """The asymmetric pad of an even-kernel "same" conv is written as one Pad whose pads are a constant, not
    the traced F.pad's shape arithmetic (which the exporter's passes paid for and the cleanup folded); the
    numbers are the unpatched model's at new lengths and batch sizes, B=1 too."""
    model = nn.Sequential(nn.Conv1d(C, C, 32, padding="same", groups=C), nn.Conv1d(C, 6, 4, padding="same"))
    with onnx_compat.patched():
        proto = export(model, (torch.randn(2, C, 40),), "torchscript", {0: {0: "B", 2: "T"}})
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Pad") == 2 and auto_pads(proto) == [], ops
    assert len(ops) <= 6, ops  # two (Constant, Pad, Conv): no Shape/Slice/Concat chain around the pads
    for batch, length in ((1, 17), (3, 73)):
        assert_matches(proto, model, torch.randn(batch, C, length))
    traced = onnx_compat.patched(during_trace=True)
    with traced:  # a plain jit.trace keeps F.pad (its module may be saved; a Python op cannot be)
        module = torch.jit.trace(model, torch.randn(2, C, 40))
    assert "PythonOp" not in str(module.graph)
