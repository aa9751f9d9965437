"""Library patches: transformers' helpers with small models built from the helpers themselves,
the registry's handling of absent libraries and changed signatures, and torch.diff."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import versions
from onnx_compat.patches import registry
from onnx_compat.patches.registry import Patch
from onnx_compat.testing import GRAD_MODES, PatchCase, patch_case_tests

transformers = pytest.importorskip("transformers")
if not transformers.utils.is_torch_available():
    pytest.skip(f"transformers {transformers.__version__} turns its PyTorch models off with torch {torch.__version__}",
                allow_module_level=True)
from transformers.models.mobilenet_v2 import modeling_mobilenet_v2 as mnv2  # noqa: E402 - loaded, as a model's


class TfPadded(nn.Module):
    """Two strided convs padded by transformers' own ``apply_tf_padding`` (MobileNetV2, tf_padding=True)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 4, 3, stride=2), nn.Conv2d(4, 4, (4, 3), stride=(3, 2), dilation=1)])

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(mnv2.apply_tf_padding(x, conv)))
        return x


class MimiStack(nn.Module):
    """transformers' ``MimiConv1d`` (causal, replicate padding) and ``EncodecConv1d`` (reflect), strided."""

    def __init__(self):
        super().__init__()
        from transformers.models.encodec.modeling_encodec import EncodecConv1d
        from transformers.models.mimi.modeling_mimi import MimiConv1d
        mimi = transformers.MimiConfig()
        encodec = transformers.EncodecConfig(use_causal_conv=False, pad_mode="reflect")
        self.layers = nn.ModuleList([MimiConv1d(mimi, 2, 4, kernel_size=7), MimiConv1d(mimi, 4, 4, 4, stride=2),
                                     EncodecConv1d(encodec, 4, 4, kernel_size=5, stride=3),
                                     MimiConv1d(mimi, 4, 3, 3, stride=2, dilation=1)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _image(B, L, seed):
    return (torch.randn(B, 3, L, L // 2 + 5, generator=torch.Generator().manual_seed(seed)),)


def _signal(B, S, seed):
    return (torch.randn(B, 2, S, generator=torch.Generator().manual_seed(seed)),)


def _mixed_pads(exporter):
    """Measured by make test-matrix: torch 2.8 (onnxscript 0.4) cannot translate aten.pad([2, s]), a static and
    a symbolic amount ("Could not determine the dtype for the input 'inputs'"); 2.13 and 2.15 can."""
    if exporter == "dynamo" and not versions.torch_at_least("2.13"):
        return (f"torch {torch.__version__}'s dynamo exporter cannot translate F.pad with a static and a "
                "symbolic amount")
    return None


# torch 2.13, transformers 5.24: how the unpatched export goes wrong
GRAD = GRAD_MODES["grad"]  # exported with autograd on, as these cases always were
CASES = [
    PatchCase("tf_padding", TfPadded, _image, {0: {0: "batch", 2: "h", 3: "w"}}, sizes=((1, 23), (3, 50), (2, 38)),
              size_names=("batch", "height"), skip=_mixed_pads, grad_mode=GRAD,
              vanilla={"torchscript": "mismatch",  # H and W baked into the pads
                       "dynamo": "invalid dimensions"}),  # strict-mode retry makes them static
    PatchCase("conv_geometry", MimiStack, _signal, {0: {0: "batch", 2: "samples"}}, sizes=((1, 92), (3, 200), (2, 152)),
              example=(2, 148), size_names=("batch", "samples"), skip=_mixed_pads, grad_mode=GRAD,
              vanilla={"dynamo": "data-dependent"}),  # TorchScript traces the tensor arithmetic right
]
test_patched_export_matches_eager, test_vanilla_export_fails_as_recorded = patch_case_tests(CASES)


def test_a_library_patch_never_imports_the_library():
    """patched() and available_patches() leave unloaded transformers modules unloaded."""
    code = ("import sys, onnx_compat\n"
            "before = {m for m in sys.modules if m.startswith('transformers')}\n"  # torch 2.1's own import of it
            "onnx_compat.available_patches()\n"
            "with onnx_compat.patched():\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('transformers') and m not in before))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _register(**kwargs):
    patch = Patch(wrapper=lambda w, i, a, k: w(*a, **k), when="export", **kwargs)
    registry.register(patch)
    return patch


@pytest.fixture
def scratch_patches():
    names = []
    yield names
    for name in names:
        registry._REGISTRY.pop(name, None)


def test_an_absent_library_makes_its_patch_unavailable_with_the_reason(scratch_patches):
    scratch_patches.append("absent_lib")
    _register(name="absent_lib", description="x", targets=("no_such_package_xyz.mod:helper",),
              library="no_such_package_xyz")
    assert "absent_lib" not in onnx_compat.available_patches()
    assert onnx_compat.unavailable_patches()["absent_lib"] == "no_such_package_xyz is not installed"
    with pytest.raises(RuntimeError, match="'absent_lib' is not available here: no_such_package_xyz is not installed"):
        onnx_compat.patched(only=["absent_lib"])
    with onnx_compat.patched():  # the default selection simply leaves it out
        assert "absent_lib" not in registry.applied_patches()


def test_a_helper_with_another_signature_is_not_wrapped(scratch_patches):
    """A library version whose helper changed: unavailable, with the version, and left alone."""
    scratch_patches.append("changed_helper")
    _register(name="changed_helper", description="x", library="transformers", signature=("features", "layer"),
              targets=("transformers.models.mobilenet_v2.modeling_mobilenet_v2:MobileNetV2ConvLayer.forward",))
    reason = onnx_compat.unavailable_patches()["changed_helper"]
    assert transformers.__version__ in reason and "(self, features)" in reason
    original = mnv2.MobileNetV2ConvLayer.forward
    with onnx_compat.patched():
        assert mnv2.MobileNetV2ConvLayer.forward is original


def test_the_transformers_patches_are_available_here():
    expected = {"tf_same_padding", "conv_geometry_ints"} if versions.HAS_DYNAMO else {"tf_same_padding"}  # dynamo-only
    assert expected <= set(onnx_compat.available_patches())
