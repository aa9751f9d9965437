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
