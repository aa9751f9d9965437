"""Issue #47 items 2 and 3: Python loops over a dynamic dim.

A loop that carries state over time (``for x_t in x.unbind(1)``, ``for t in range(x.size(1))``) is run as a
``scan`` while dynamo traces (``patches/scan_loops.py``) and exported as an ONNX ``Scan``: checked against the
unpatched eager model at lengths 1, the example's 37 and 4x it (148), B=1 included; without the patches the
dynamo export specialises the length. What cannot be a scan (a mask stored row by row, a trip count that is
a function of the length) is refused naming its line.
"""
import dataclasses

import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ExportError
from onnx_compat.testing import PatchCase, patch_case_tests

from helpers import needs_dynamo
from pattern_models_loops import Log2Scan, RangeLSTM, RowMask, UnbindRNN

# lengths 1, the example's (37, at another batch) and 4x the example
SIZES = ((1, 1), (3, 37), (2, 148))


def _x(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _a_scan(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert "Scan" in ops or "Loop" in ops, f"the loop was not exported as a graph loop: {ops}"


CASES = [PatchCase(name, build, _x, {0: {0: "batch", 1: "time"}}, sizes=SIZES, exporters=("dynamo",),
                   vanilla={"dynamo": "Got invalid dimensions"}, graph=_a_scan, atol=1e-4, rtol=1e-3)
         for name, build in (("unbind_rnn", UnbindRNN), ("range_lstm_cat", RangeLSTM))]
# the plain export unrolls 37 LSTM cells (~35 s): its failure is recorded on the Elman loop only
CASES[1] = dataclasses.replace(CASES[1], vanilla={})
test_loop_exports_as_a_scan, test_vanilla_loop_is_specialised = patch_case_tests(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    case.assert_eager_untouched()


# --- what cannot be a scan: one error naming the line, with either exporter ----------------------------

def _line(cls, offset: int) -> str:
    return f"pattern_models_loops.py:{cls.forward.__code__.co_firstlineno + offset}"


def _export(model, tmp_path, exporter, lengths=False):
    b, t = Dim("batch"), Dim("time")
    width = 16 if isinstance(model, UnbindRNN) else 8
    inputs = [TensorSpec("x", [b, t, 8])] + ([TensorSpec("lengths", [b], dtype=torch.int64)] if lengths else [])
    with pytest.raises(ExportError) as raised:
        onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, [TensorSpec("y", [b, t, width])],
                           exporter=exporter)
    assert not (tmp_path / "m.onnx").exists()
    return str(raised.value)


@needs_dynamo
def test_a_mask_stored_row_by_row_is_refused_with_its_line_and_why_under_dynamo(tmp_path):
    """The loop over the batch stores into ``mask`` by subscript: no scan step can carry that; the refusal says
    so at the ``for`` line (plain dynamo: a data-dependent guard with no line of the model)."""
    text = _export(RowMask(), tmp_path, "dynamo", lengths=True)
    head = text.split("also tried")[0]
    assert _line(RowMask, 2) in head and "stores into mask[i, lengths[i]:]" in head, text[-1200:]


@needs_dynamo
def test_a_trip_count_from_log2_of_the_length_is_refused_at_its_line_under_dynamo(tmp_path):
    """``range(ceil(log2(T)))``: plain dynamo writes the example's levels and the graph fails at other lengths,
    naming no line; patched, ``math.log2`` of the dynamic size is refused where it is taken. (The plain
    attempt's wrong graph got further, to verification, so ``first_cause`` lists its error first.)"""
    text = _export(Log2Scan(), tmp_path, "dynamo")
    assert f"{_line(Log2Scan, 3)}: a math function takes the dynamic size" in text, text[-1200:]
    assert "without the patches): VerificationError" in text, text[-1200:]


@pytest.mark.parametrize("model,offset", [(UnbindRNN, 3), (RowMask, 2), (Log2Scan, 3)],
                         ids=["unbind_rnn", "row_mask", "log2_levels"])
def test_torchscript_names_the_line_that_unrolled_a_loop(tmp_path, model, offset):
    """TorchScript unrolls each of these at the example's size (verification fails at other lengths); the
    error names the model's line. An explicit ``unbind(1)`` gave no TracerWarning, so no line, before."""
    text = _export(model(), tmp_path, "torchscript", lengths=model is RowMask)
    assert f"frozen into the graph by Python code at " in text and _line(model, offset) in text, text[-1200:]
