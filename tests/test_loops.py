"""Issue #47 items 2 and 3: Python loops over a dynamic dim.

A loop that carries state over time (``for x_t in x.unbind(1)``, ``for t in range(x.size(1))``) is run as a
``scan`` while dynamo traces (``patches/scan_loops.py``) and exported as an ONNX ``Scan``: checked against the
unpatched eager model at lengths 1, the example's 37 and 4x it (148), B=1 included; without the patches the
dynamo export specialises the length. What cannot be a scan (a mask stored row by row, a trip count that is
a function of the length) is refused naming its line.
"""
import dataclasses
import sys

import pytest
import torch

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ExportError
from onnx_compat.patches import scan_loops
from onnx_compat.testing import PatchCase, patch_case_tests

from helpers import needs_dynamo
from pattern_models_loops import (CountingLoop, CountingNeuron, KeptStateLoop, Log2Scan, PowerOfTwoPad,
                                  PowerOfTwoPadByName, RangeLSTM,
                                  RowMask, ScanRNN, SpikingNet, StateOnSelfLoop, TimeFirstRNN, UnbindRNN)

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
# the route the refusals name: the loop written with torch's scan (plain dynamo exports it as well)
CASES.append(PatchCase("scan_written_rnn", ScanRNN, _x, {0: {0: "batch", 1: "time"}}, sizes=SIZES,
                       exporters=("dynamo",), graph=_a_scan, atol=1e-4, rtol=1e-3))
# time-first, iterated as ``for x_t in x``: dim 0 is time, so the loop is a scan, not a loop over the batch's rows
# (which ``batch_rows.py`` lifts only for a length regulator, and refused this cell's Linear as "one row of a batch")
CASES.append(PatchCase("time_first_iterated_rnn", TimeFirstRNN, lambda B, T, seed: (_x(B, T, seed)[0].transpose(0, 1),),
                       {0: {0: "time", 1: "batch"}}, sizes=SIZES, exporters=("dynamo",), graph=_a_scan, atol=1e-4,
                       rtol=1e-3))
# state kept on modules (snntorch's ``self.mem = ...``): carried by the scan beside the loop's own variables
CASES += [PatchCase(name, build, _x, {0: {0: "batch", 1: "time"}}, sizes=SIZES, exporters=("dynamo",),
                    graph=_a_scan, atol=1e-4, rtol=1e-3)
          for name, build in (("state_kept_on_a_module", KeptStateLoop), ("spiking_net", SpikingNet),
                              ("tuple_state_on_self", StateOnSelfLoop))]
test_loop_exports_as_a_scan, test_vanilla_loop_is_specialised = patch_case_tests(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eager_is_untouched_inside_patched(case):
    case.assert_eager_untouched()


# --- what cannot be a scan: one error naming the line, with either exporter ----------------------------

def _line(cls, offset: int) -> str:
    return f"pattern_models_loops.py:{cls.forward.__code__.co_firstlineno + offset}"


def _export(model, tmp_path, exporter, lengths=False):
    b, t = Dim("batch"), Dim("time")
    width = 16 if isinstance(model, (UnbindRNN, ScanRNN, KeptStateLoop)) else 8
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
def test_a_python_value_a_step_changes_on_a_module_is_refused_naming_it(tmp_path):
    """A step that counts in a Python int on its module (``self.steps += 1``) cannot be one traced scan step: the
    count would move once. The refusal names the loop, the attribute and the values."""
    text = _export(CountingLoop(), tmp_path, "dynamo")
    assert _line(CountingLoop, 3) in text and "changes CountingNeuron.steps (a Python int, 0 -> 1)" in text, \
        text[-1500:]


@needs_dynamo
def test_state_kept_on_modules_is_theirs_again_after_the_export(tmp_path):
    """The first step and the scan write the neurons' state while the export traces; afterwards each module holds
    what it held before, and the eager model computes what it computed before."""
    model = SpikingNet().eval()
    x = _x(3, 11, 5)[0]
    with torch.no_grad():
        before = model(x)
    held = {name: (m.mem, m.reset) for name, m in (("lif1", model.lif1), ("lif2", model.lif2))}
    b, t = Dim("batch"), Dim("time")
    onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 8])],
                       [TensorSpec("y", [b, t, 16])], exporter="dynamo")
    for name, m in (("lif1", model.lif1), ("lif2", model.lif2)):
        assert m.mem is held[name][0] and m.reset is held[name][1], name
    with torch.no_grad():
        assert torch.equal(model(x), before)


@needs_dynamo
def test_a_trip_count_from_log2_of_the_length_is_refused_at_its_line_under_dynamo(tmp_path):
    """``range(ceil(log2(T)))``: plain dynamo writes the example's levels and the graph fails at other lengths,
    naming no line; patched, ``math.log2`` of the dynamic size is refused where it is taken. The refusal is
    deliberate, so it ends the capture (``refusals_end_capture``): no strict retry, no unpatched attempt."""
    text = _export(Log2Scan(), tmp_path, "dynamo")
    assert f"{_line(Log2Scan, 3)}: a math function takes the dynamic size" in text, text[-1200:]
    assert "also tried" not in text, text[-1200:]


@needs_dynamo
def test_padding_to_a_power_of_two_is_refused_at_its_line_under_dynamo(tmp_path):
    """``(T - 1).bit_length()``: plain dynamo specialises the length (``DimSpecialized``, no line of the model);
    patched, the refusal names the line and ends the capture."""
    text = _export(PowerOfTwoPad(), tmp_path, "dynamo")
    assert f"{_line(PowerOfTwoPad, 2)}: bit_length() takes the dynamic size" in text, text[-1200:]
    assert "Declare the dim's maximum" in text and "also tried" not in text, text[-1200:]


def _with_most(model, tmp_path, most=60):
    """export(dynamo) with the length's maximum declared: the report, or the error."""
    b, t = Dim("batch"), Dim("time", min=2, max=most, example=37)
    try:
        return onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("x", [b, t, 8])],
                                  [TensorSpec("y", [b, t, 8])], exporter="dynamo")
    except ExportError as exc:
        assert not (tmp_path / "m.onnx").exists()
        return exc


@needs_dynamo
def test_a_power_of_two_pad_with_a_declared_maximum_pads_to_one_length_and_verifies(tmp_path):
    """``(T - 1).bit_length()`` of a time dim declared up to 60 is taken one past its maximum: the model pads
    every input to 64 frames, and the graph verifies at new lengths against the unpatched model, B=1 first
    (a cumulative sum cut back to T: padding further changes nothing). The report says what was taken."""
    report = _with_most(PowerOfTwoPad(), tmp_path)
    assert not isinstance(report, Exception), str(report)[:800]
    assert [c["sizes"]["batch"] for c in report.verification][0] == 1 and all(c["ok"] for c in report.verification)
    said = " ".join(report.warnings["other"])
    assert f"{_line(PowerOfTwoPad, 2)}: bit_length() takes the dynamic size" in said
    assert "taken as 60, one past its declared maximum" in said


@needs_dynamo
def test_math_functions_imported_by_name_are_taken_the_same_way(tmp_path):
    """``2 ** ceil(log2(T))`` after ``from math import ceil, log2``: refused at its line without a maximum (before,
    dynamo specialised the length naming no line), padded to one length and verified with one."""
    text = _export(PowerOfTwoPadByName(), tmp_path, "dynamo")
    assert f"{_line(PowerOfTwoPadByName, 2)}: a math function takes the dynamic size" in text, text[-1200:]
    report = _with_most(PowerOfTwoPadByName(), tmp_path)
    assert not isinstance(report, Exception), str(report)[:800]
    assert all(c["ok"] for c in report.verification) and report.verification[0]["sizes"]["batch"] == 1


@needs_dynamo
def test_a_trip_count_taken_at_the_maximum_is_verified_not_trusted(tmp_path):
    """A parallel (Hillis-Steele) scan whose every level shifts by ``2 ** k``: levels past the length are not
    neutral (the shifted slice is longer than the input), so the graph taken at the maximum fails at new
    lengths and export() writes nothing. The error says what the graph assumed, at the model's line."""
    error = _with_most(Log2Scan(), tmp_path)
    assert isinstance(error, ExportError) and "VerificationError" in str(error), str(error)[:800]
    assert "[the graph assumed: " in str(error) and f"{_line(Log2Scan, 3)}: a math function of the size taken at 61" \
        in str(error), \
        str(error)[-800:]


@pytest.mark.parametrize("model,offset", [(UnbindRNN, 3), (RowMask, 2), (Log2Scan, 3)],
                         ids=["unbind_rnn", "row_mask", "log2_levels"])
def test_torchscript_names_the_line_that_unrolled_a_loop(tmp_path, model, offset):
    """TorchScript unrolls each of these at the example's size (verification fails at other lengths); the
    error names the model's line. An explicit ``unbind(1)`` gave no TracerWarning, so no line, before."""
    text = _export(model(), tmp_path, "torchscript", lengths=model is RowMask)
    assert "frozen into the graph by Python code at " in text and _line(model, offset) in text, text[-1200:]


# --- the lift itself, in eager: the loop run as a scan computes what its Python loop computes ------------

class Lifter:
    """``for x_t in u.unbind(x, d)``: with ``u = torch`` the model's Python loop, with ``Lifter`` the same loop
    run as a scan by ``scan_loops`` (what ``dynamic_loops`` does while dynamo traces), in eager."""

    @staticmethod
    def unbind(x, dim):
        frame = sys._getframe(1)
        loop = scan_loops.loop_at(frame)
        scan_loops.check_unbound(loop, False)
        scan_loops.lift(frame, loop, x.movedim(dim, 0))
        return ()


def stacked_with_final_state(x, w, u):
    h = torch.zeros(x.shape[0], w.shape[1])
    outs = []
    for x_t in u.unbind(x, 1):
        h = torch.tanh(x_t @ w[:8] + h @ w[8:])
        outs.append(h * 2)
    return torch.stack(outs, 1), h


def two_states_joined_by_cat(x, w, u):
    h = torch.zeros(x.shape[0], w.shape[1])
    c, ys = torch.ones_like(h), []
    for x_t in u.unbind(x, 1):
        gate = torch.sigmoid(x_t @ w[:8])
        c = gate * c + (1 - gate) * torch.tanh(h @ w[8:])
        h = c.relu()
        ys.append(h[:, None, :4])
    return torch.cat(ys, 1), c


def final_state_only(x, w, u):
    s = torch.zeros(x.shape[0], 8)
    for x_t in u.unbind(x, 1):
        s = 0.9 * s + x_t
    return s


@pytest.mark.parametrize("fn", [stacked_with_final_state, two_states_joined_by_cat, final_state_only],
                         ids=lambda f: f.__name__)
def test_a_lifted_loop_computes_what_the_python_loop_computes(fn):
    x, w = torch.randn(3, 5, 8), torch.randn(24, 16)
    expected, got = fn(x, w, torch), fn(x, w, Lifter)
    expected, got = (expected, got) if isinstance(got, tuple) else ((expected,), (got,))
    for e, g in zip(expected, got):
        assert g.shape == e.shape and torch.allclose(g, e, atol=1e-6), (fn.__name__, (g - e).abs().max())


def breaks_early(x, u):
    h = torch.zeros(x.shape[0], 8)
    for x_t in u.unbind(x, 1):
        h = h + x_t
        if h.sum() > 3:
            break
    return h


def reads_its_outputs(x, u):
    outs = [x[:, 0]]
    for x_t in u.unbind(x, 1):
        outs.append(outs[-1] + x_t)
    return torch.stack(outs, 1)


def temporary_read_after(x, u):
    h = torch.zeros(x.shape[0], 8)
    for x_t in u.unbind(x, 1):
        step = x_t * 2
        h = h + step
    return h + step


def list_used_by_len(x, u):
    outs = []
    for x_t in u.unbind(x, 1):
        outs.append(x_t)
    return torch.stack(outs, 1) * len(outs)


def non_tensor_state(x, u):
    n = 0
    for x_t in u.unbind(x, 1):
        n = n + 1
    return x * n


def reversed_steps(x, u):
    outs = []
    for x_t in reversed(u.unbind(x, 1)):
        outs.append(x_t)
    return torch.stack(outs, 1)


def mutates_a_tensor_in_place(x, u):
    acc = torch.zeros(x.shape[0], 8)
    h = torch.zeros(x.shape[0], 8)
    for x_t in u.unbind(x, 1):
        acc.add_(x_t)
        h = h + acc
    return h + acc


@pytest.mark.parametrize("fn,why", [
    (breaks_early, "'break' statement"), (reads_its_outputs, "was not an empty list"),
    (temporary_read_after, "'step', set in the loop, is read after it"),
    (list_used_by_len, "'outs' is used at line"), (non_tensor_state, "carries 'n', which is a int"),
    (reversed_steps, "is not the unbound tensor itself"),
    (mutates_a_tensor_in_place, "does not trace as a scan step")], ids=lambda v: getattr(v, "__name__", ""))
def test_a_loop_a_scan_would_change_is_not_lifted(fn, why):
    """Each would compute something else as a scan (or could not be one): the reason, checked on the source
    before anything runs, is what the refusal says."""
    with pytest.raises(scan_loops.NotLiftable, match=why):
        fn(torch.randn(2, 5, 8), Lifter)


def test_a_scan_under_torchscript_is_named_at_the_model_line(tmp_path):
    """Plain TorchScript fails inside torch ("could not find kernel for HigherOrderOperator scan"); patched, the
    model's scan call is named with the exporter that writes it as an ONNX Scan."""
    text = _export(ScanRNN(), tmp_path, "torchscript")
    head = text.split("also tried")[0]
    assert "torch's scan is traced only by the dynamo exporter" in head and _line(ScanRNN, 7) in head, \
        text[-1200:]
