"""espnet's FastSpeech length regulator (issue #39, 8; second sweep): a branch that repairs all-zero durations
in place, and rows padded by hand into a fresh buffer. The padded forms' numeric cases and recorded vanilla
failures are in test_patterns.py (LENGTHS_CASES, "regulator_*"); here: the branch taken both ways in the
exported graph (all-zero durations at sizes the export never saw, B=1 too), which branches count as repairs,
the conditional store itself, and the refusals that name their line."""
import warnings

import numpy as np
import pytest
import torch

import onnx_compat
from onnx_compat.patches.checks import repair_entry
from onnx_compat.patches.stores import conditional_store

import pattern_models
from helpers import EXPORTERS, export, line_of, run
from pattern_models import PaddedByHandRegulator, RepairedDurations

needs_dynamo = pytest.mark.skipif("dynamo" not in EXPORTERS, reason="the dynamo exporter is used from torch 2.13 on")
_AXES = {0: {0: "b", 1: "t"}, 1: {0: "b", 1: "t"}}


def _example():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 37, 8, generator=g), torch.randint(1, 4, (2, 37), generator=g)  # the branch not taken


def _checks():
    """(what, x, durations): all zeros (the branch taken), one row of zeros (not taken: the sum is not 0),
    random; B=1 among them, no size the export saw."""
    g = torch.Generator().manual_seed(1)
    one_row = torch.randint(1, 4, (3, 9), generator=g)
    one_row[1] = 0
    return [("all zero, B=1", torch.randn(1, 6, 8, generator=g), torch.zeros(1, 6, dtype=torch.int64)),
            ("all zero, B=3", torch.randn(3, 11, 8, generator=g), torch.zeros(3, 11, dtype=torch.int64)),
            ("one row of zeros", torch.randn(3, 9, 8, generator=g), one_row),
            ("random, B=4", torch.randn(4, 5, 8, generator=g), torch.randint(0, 4, (4, 5), generator=g))]


def _mismatches(proto, model):
    """The checks ONNX Runtime gets wrong against the unpatched eager model, with why."""
    wrong = {}
    for what, x, durations in _checks():
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = model(x, durations).numpy()
        assert np.abs(expected).max() > 0, f"{what}: degenerate reference"
        try:
            got = run(proto, x.numpy(), durations.numpy())[0]
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's refusal is a mismatch too
            wrong[what] = str(exc)[:200]
            continue
        if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-5, rtol=1e-4):
            wrong[what] = f"shape {got.shape} vs {expected.shape}" if got.shape != expected.shape else \
                f"max abs err {np.abs(got - expected).max():.3g}"
    return wrong


@pytest.mark.parametrize("model", [RepairedDurations, lambda: PaddedByHandRegulator("new_fill", -1.0)],
                         ids=["branch_alone", "padded_by_hand"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_repairing_branch_acts_where_eager_takes_it(exporter, model):
    """Exported from an example that does not take the branch, the graph takes it on all-zero durations and
    nowhere else, as eager does."""
    torch.manual_seed(0)
    model = model().eval()
    with onnx_compat.patched():
        proto = export(model, _example(), exporter, _AXES)
    assert _mismatches(proto, model) == {}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_vanilla_repairing_branch_fails_as_recorded(exporter):
    """Unpatched, TorchScript keeps the example's side (wrong numbers exactly where the branch is taken) and
    dynamo stops on the branch."""
    torch.manual_seed(0)
    model = RepairedDurations().eval()
    if exporter == "dynamo":
        with pytest.raises(Exception, match="data-dependent"):
            export(model, _example(), exporter, _AXES)
        return
    wrong = _mismatches(export(model, _example(), exporter, _AXES), model)
    assert set(wrong) == {"all zero, B=1", "all zero, B=3"}, wrong


# --- which branches are repairs -------------------------------------------------------------------

def _first_jump_offset(fn):
    import dis
    return next(i.offset for i in dis.get_instructions(fn) if i.opname.startswith("POP_JUMP"))


@pytest.mark.parametrize("fn,entered", [
    (pattern_models._repair_form, True),  # a report and a masked store
    (pattern_models._repair_negated_form, False),  # ``if not ...``: the body is entered on False
    (pattern_models._repair_else_form, None),  # an else branch: real control flow
    (pattern_models._rebind_form, None),  # binds a name
    (pattern_models._augmented_form, None),  # ``t[:, 0] += 1`` changes a view before its store
    (pattern_models._in_place_call_form, None),  # clamp_ acts whether or not the store is kept
    (pattern_models._call_form, None),  # a call for its effect
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_repair_is_read_from_bytecode(fn, entered):
    assert repair_entry(fn.__code__, _first_jump_offset(fn)) is entered


@pytest.mark.parametrize("index", ["mask", "mask_values", "int", "slice", "rows"])
@pytest.mark.parametrize("holds", [True, False])
def test_a_conditional_store_is_the_store_or_nothing(index, holds):
    g = torch.Generator().manual_seed(3)
    t = torch.randn(4, 5, generator=g)
    mask = torch.tensor([True, False, True, False])
    key, value = {"mask": (mask, 7.0), "mask_values": (mask, torch.randn(2, 5, generator=g)),
                  "int": (1, torch.randn(5, generator=g)), "slice": ((slice(None), slice(1, 3)), -2.0),
                  "rows": (torch.tensor([3, 0]), torch.tensor(5.0))}[index]
    expected = t.clone()
    if holds:
        expected[key] = value
    view = t.clone()[1:]  # a view: the store reaches its base as eager's does
    base = view._base
    conditional_store(t, key, value, torch.tensor(holds))
    torch.testing.assert_close(t, expected)
    before = base.clone()
    conditional_store(view, 0, 9.0, torch.tensor(holds))
    assert torch.equal(base[1], torch.full((5,), 9.0) if holds else before[1])


# --- what stays refused, naming its line ----------------------------------------------------------

@needs_dynamo
def test_a_branch_that_binds_a_name_is_taken_as_where():
    """``if ds.sum() == 0: ds = ds + 1`` binds a name: not a repair by stores, but a choice of values (``ds``
    keeps its value where the test is false), so the dynamo capture takes it as ``torch.where``
    (``patches/value_branches.py``; it was refused naming its line before): the graph takes it on all-zero
    durations and nowhere else, as eager does."""
    model = PaddedByHandRegulator("new_fill", repair="rebound").eval()
    with onnx_compat.patched():
        proto = export(model, _example(), "dynamo", _AXES)
    assert _mismatches(proto, model) == {}


@needs_dynamo
def test_a_buffer_of_one_row_per_list_item_is_refused_naming_the_store():
    """``torch.zeros(len(rows), ...)`` holds one row for the one lifted row standing for the batch: the store
    into it is refused, naming the line."""
    model = PaddedByHandRegulator("torch_zeros").eval()
    with onnx_compat.patched(), pytest.raises(Exception) as raised:
        export(model, _example(), "dynamo", _AXES)
    text = str(raised.value)
    line = line_of(pattern_models.pad_into_buffer, "pad[i, :rows[i].size(0)] = rows[i]")
    assert f"pattern_models.py:{line}" in text and "torch.zeros(len(rows), ...) has one row" in text, text[-800:]


def test_rows_stored_out_of_order_are_stored_as_the_model_stores_them():
    """TorchScript holds row stores back only while they come in order: at a store out of order the held
    ones happen as they were, so nothing is lost (the loop stays unrolled at the example's batch, 3)."""
    model = PaddedByHandRegulator("interleaved", -1.0).eval()
    g = torch.Generator().manual_seed(4)
    with onnx_compat.patched():
        proto = export(model, (torch.randn(3, 13, 8, generator=g), torch.randint(1, 4, (3, 13), generator=g)),
                       "torchscript", _AXES)
    for T in (7, 21):
        x, durations = torch.randn(3, T, 8, generator=g), torch.randint(0, 4, (3, T), generator=g)
        with torch.no_grad():
            expected = model(x, durations).numpy()
        np.testing.assert_allclose(run(proto, x.numpy(), durations.numpy())[0], expected, atol=1e-5,
                                   err_msg=f"B=3, T={T}")
