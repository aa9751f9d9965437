"""A remainder of a size adds a verification shape where it is zero (``pipeline/size_remainders.py``): a branch on
``T % block`` that the example and the three default shapes all take the same way is checked on its other side."""
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec

from helpers import EXPORTERS
from pattern_models_round3h import PaddedBlocks

BLOCK = 4


class PaddedToBlock(nn.Module):
    """The same padding written without a branch (``(-T) % 4``): right at every length."""

    def forward(self, x):
        t = x.shape[1]
        blocks = F.pad(x, (0, 0, 0, (-t) % BLOCK)).unflatten(1, (-1, BLOCK))
        return (blocks - blocks.mean(2, keepdim=True)).flatten(1, 2)[:, :t]


def _specs():
    b, t = Dim("batch"), Dim("time", min=2)
    return [TensorSpec("x", [b, t, 8])], [TensorSpec("y", [b, t, 8])]


@pytest.mark.parametrize("rounded", [False, True], ids=["mod", "rounded"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_branch_on_a_remainder_is_checked_where_the_remainder_is_zero(exporter, rounded, tmp_path):
    """``PaddedBlocks`` (transformers' Granite speech block attention, reduced). Without the added shape each
    exporter wrote a graph verified at T = 23, 53, 30 that failed at T = 8, 12, 20 (TorchScript: Reshape at run
    time; dynamo: max abs err 1.4). TorchScript's graph holds the example's side and is refused at the multiple;
    dynamo's holds both sides (``patches/size_branches.py``) and is verified there too. The remainder spelled
    ``t - t // 4 * 4`` is found as well."""
    path = str(tmp_path / "m.onnx")
    inputs, outputs = _specs()
    if exporter == "dynamo":
        report = onnx_compat.export(PaddedBlocks(rounded=rounded).eval(), path, inputs, outputs, exporter=exporter)
        times = [c["sizes"]["time"] for c in report.verification]
        assert len(times) == 4 and times[-1] % BLOCK == 0 and all(c["ok"] for c in report.verification), times
        return
    with pytest.raises(onnx_compat.ExportError) as refused:
        onnx_compat.export(PaddedBlocks(rounded=rounded).eval(), path, inputs, outputs, exporter=exporter)
    sizes = re.search(r"at sizes \{'batch': \d+, 'time': (\d+)\}", str(refused.value))
    assert sizes and int(sizes.group(1)) % BLOCK == 0, str(refused.value)[:600]
    assert not os.path.exists(path)


def test_a_model_right_at_every_length_verifies_at_a_multiple_too(tmp_path):
    inputs, outputs = _specs()
    report = onnx_compat.export(PaddedToBlock(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript")
    times = [c["sizes"]["time"] for c in report.verification]
    # the default three, one at a multiple, and (the trace froze a size) the far check at four times the example
    assert len(times) == 5 and times[3] % BLOCK == 0 and times[4] == 4 * 37, times
    assert all(c["ok"] for c in report.verification), times
    assert sum(t % BLOCK == 0 for t in times[:3]) == 0  # the default three shapes alone never reach a multiple


def test_verify_by_hand_adds_the_shape_from_the_graph(tmp_path):
    """A user's own export checked with ``onnx_compat.verify``: the graph's ``Mod`` of a ``Shape`` by 4 adds the
    shape at a multiple, where this graph fails (it passed at the three default shapes)."""
    import io
    model, (inputs, outputs) = PaddedBlocks().eval(), _specs()
    buf = io.BytesIO()
    with onnx_compat.patched(), torch.no_grad():
        torch.onnx.export(model, (torch.randn(2, 37, 8),), buf, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "time"}, "y": {0: "batch", 1: "time"}})
    import onnx
    proto = onnx.load_from_string(buf.getvalue())
    results = onnx_compat.verify(proto, model, inputs, outputs, raise_on_failure=False)
    assert [r.ok for r in results] == [True, True, True, False], results
    assert results[-1].sizes["time"] % BLOCK == 0


class RoundedUp(nn.Module):
    """The frames padded up to a multiple of 4 by ``math.ceil(t / 4) * 4`` ("ceil") or ``-(-t // 4) * 4``."""

    def __init__(self, form="ceil"):
        super().__init__()
        self.form = form

    def forward(self, x):
        t = x.shape[1]
        padded = math.ceil(t / BLOCK) * BLOCK if self.form == "ceil" else t // BLOCK * BLOCK
        return F.pad(x, (0, 0, 0, padded - t)) if self.form == "ceil" else x[:, :padded] * 2


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="no dynamo exporter here")
@pytest.mark.parametrize("form", ["ceil", "floor"])
def test_a_size_rounded_to_a_multiple_names_its_divisor_in_the_graph(form):
    """Dynamo writes ``math.ceil(t / 4) * 4`` as ``Mul(Cast(Ceil(Div(Cast(size), 4))), 4)`` and ``t // 4 * 4`` as
    ``Mul(Div(size, 4), 4)``: both are the size's remainder by 4 in other spellings; ``size * 4 / 4`` is not."""
    import io
    import onnx
    from onnx_compat.pipeline import size_remainders
    buf = io.BytesIO()
    torch.onnx.export(RoundedUp(form), (torch.randn(2, 37, 3),), buf, dynamo=True,
                      dynamic_shapes=({0: torch.export.Dim("b"), 1: torch.export.Dim("t")},))
    assert size_remainders.divisors_in_graph(onnx.load_from_string(buf.getvalue())) == [BLOCK]


def test_a_float_quotient_multiplied_back_is_no_remainder():
    import onnx
    from onnx import TensorProto, helper
    from onnx_compat.pipeline import size_remainders
    four = helper.make_tensor("four", TensorProto.FLOAT, [], [4.0])
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["f"], to=1),
                               helper.make_node("Div", ["f", "four"], ["q"]),
                               helper.make_node("Mul", ["q", "four"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [four])
    assert size_remainders.divisors_in_graph(helper.make_model(graph)) == []
    onnx.checker.check_model(helper.make_model(graph))


class ComplexScaled(nn.Module):
    """A product with a complex constant beside a size (a phase turned into a spectrum): no divisor, no error."""

    def forward(self, x):
        spectrum = torch.polar(torch.ones_like(x), x) * (1j * x.shape[1])
        return torch.view_as_real(spectrum).sum(-1)


def test_a_complex_constant_is_no_divisor():
    from onnx_compat.pipeline import size_remainders
    graph = torch.jit.trace(ComplexScaled(), (torch.randn(2, 8),)).graph
    assert any(n.kind() == "aten::mul" for n in graph.nodes())
    assert size_remainders.divisors(graph) == []


def test_a_weight_kept_in_a_file_is_not_read_for_a_divisor():
    """On the on-disk path the graph's initializers point into a file the check cannot see (music2latent's encoder,
    62 MiB: "should be stored in torchscript.data, but it is not regular file"): a one-element weight there is no
    divisor and is not read."""
    from onnx import TensorProto, helper
    from onnx_compat.pipeline import size_remainders
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [4.0])
    scale.ClearField("float_data")
    scale.data_location = TensorProto.EXTERNAL
    scale.external_data.add(key="location", value="absent.data")
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Div", ["s", "scale"], ["q"]),
                               helper.make_node("Mul", ["q", "scale"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [scale])
    assert size_remainders.divisors_in_graph(helper.make_model(graph)) == []
