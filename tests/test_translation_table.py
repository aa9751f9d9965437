"""The dynamo exporter's table of ONNX translations, built once per process while patched
(``patches/translation_table.py``): each export gets a registry of its own, what one export registers never
reaches the next, and the graphs are the ones a table built anew gives."""
import pytest
import torch
import torch.nn as nn

import onnx_compat

from helpers import EXPORTERS

pytestmark = pytest.mark.skipif("dynamo" not in EXPORTERS, reason="the dynamo exporter is used from torch 2.13 on")


def _registry_class():
    from torch.onnx._internal.exporter._registration import ONNXRegistry
    return ONNXRegistry


def test_each_export_gets_a_registry_of_its_own_built_once(monkeypatch):
    from onnx_compat.patches import translation_table
    monkeypatch.setattr(translation_table, "_built", {})
    registry = _registry_class()
    with onnx_compat.patched():
        first = registry.from_torchlib()
        second = registry().from_torchlib()  # as torch.onnx's export_compat calls it
        other = registry.from_torchlib(opset_version=first.opset_version + 1)
    assert first is not second and first.functions is not second.functions
    assert first.functions.keys() == second.functions.keys() and len(first.functions) > 300
    assert len(translation_table._built) == 2 and other.opset_version == first.opset_version + 1
    # what one export registers (a custom translation is inserted first in its op's list) stays there
    target = torch.ops.aten.relu.default
    before = [m.onnx_function for m in second.functions[target.name()]]
    first.register_op(target, lambda x: x)
    assert len(first.functions[target.name()]) == len(before) + 1
    assert [m.onnx_function for m in second.functions[target.name()]] == before
    with onnx_compat.patched():
        third = registry.from_torchlib()
    assert [m.onnx_function for m in third.functions[target.name()]] == before
    # outside patched() torch builds its own, as before: nothing is kept
    assert registry.from_torchlib().functions.keys() == first.functions.keys()
    assert len(translation_table._built) == 2


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.proj(self.norm(x))) * x.softmax(-1)


def test_graphs_are_the_ones_a_new_table_gives(tmp_path):
    """The same model exported twice with the kept table (the second served from it) and with the patch left out:
    the same nodes, and ONNX Runtime's numbers checked against the unpatched model at new sizes by the pipeline
    each time."""
    import onnx
    from onnx_compat import Dim, TensorSpec
    from onnx_compat.patches import translation_table
    inputs, outputs = [TensorSpec("x", [Dim("b"), Dim("t"), 8])], [TensorSpec("y", [Dim("b"), Dim("t"), 8])]
    ops, kept = [], []
    for k, patches in enumerate([None, None, {"exclude": ["translation_table"]}]):
        path = str(tmp_path / f"m{k}.onnx")
        report = onnx_compat.export(_Block(), path, inputs, outputs, exporter="dynamo",
                                    **({"patches": patches} if patches else {}))
        assert all(c["ok"] for c in report.verification)
        ops.append([n.op_type for n in onnx.load(path).graph.node])
        kept.append(len(translation_table._built))
    assert ops[0] == ops[1] == ops[2] and "Relu" in ops[0]
    assert kept[0] == kept[1] == kept[2] >= 1  # the second export was served from the table the first kept
