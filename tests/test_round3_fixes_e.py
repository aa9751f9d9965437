"""Issue #47 round one, speechbrain's LiGRU forms (``tests/pattern_models_round3i.py``), under dynamo.

``h.chunk(2, dim=0)`` of the ``2 * B`` rows a bidirectional layer stacked: torch counts the pieces as
``(2B + B - 1) // B``, which its solver cannot prove is 2, and the batch became static (``fixed_pieces``: n
narrows where the dim is a multiple of n). A step that multiplies by a ``[1]`` buffer read before the loop: the
step's trace, under torch.onnx's ``backed_size_oblivious``, gave the buffer a size symbol of its own that ``[B, 16]``
cannot broadcast against (``scan_traces``: traced again with sizes of 1 specialised). speechbrain's statistics
pooling: a loop over the batch that carries no state (torch's scan refuses none; the lift gives it one it
passes through), each item sliced by a length read from the data; its x-vector tries each layer with the lengths
and catches the ``TypeError`` of those that take none, which left torch.fx's module stack behind
(``caught_module_errors``). Each checked against the unpatched eager model at new sizes, B=1 included; each loop
exported as one ONNX ``Scan``.
"""
import pytest
import torch

from onnx_compat.patches import scan_traces
from onnx_compat.testing import PatchCase, bare_onnx, patch_case_tests

from helpers import EXPORTERS
from pattern_models_round3i import ItemStatistics, MaskedLiGRU, StackedDirections, TriesWithLengths

SIZES = ((1, 1), (3, 9), (1, 36), (2, 36))


def _inputs(B, T, seed):
    return (torch.randn(B, T, 8, generator=torch.Generator().manual_seed(seed)),)


def _one_scan(proto, exporter):
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Scan") + ops.count("Loop") == 1, f"the loop should be one graph loop: {ops}"


_SPECIALISED = "Got invalid dimensions"  # the batch made static: B=1 refused by ONNX Runtime
CASES = [
    PatchCase("stacked_directions_chunk", StackedDirections, _inputs, {0: {0: "batch", 1: "time"}}, sizes=SIZES,
              example=(3, 9), exporters=("dynamo",), vanilla={"dynamo": _SPECIALISED}),
    PatchCase("ligru_masked_step", MaskedLiGRU, _inputs, {0: {0: "batch", 1: "time"}}, sizes=SIZES,
              example=(3, 9), exporters=("dynamo",), graph=_one_scan, atol=1e-5, rtol=1e-4,
              vanilla={"dynamo": _SPECIALISED}),
]
test_ligru_form_matches_eager, test_vanilla_ligru_form_fails_as_recorded = patch_case_tests(CASES)


def _relative_lengths(B, T, seed):
    """x and each item's length as a share of T (speechbrain's relative lengths), at least 2 frames, one full."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(2, T + 1, (B,), generator=g)
    frames[0] = T
    return torch.randn(B, T, 8, generator=g), frames.float() / T


# a loop that carries nothing: torch's scan wants a state ("scan() operator requires init leaves"), and the lift
# gives it one it passes through; the per-item slice by a number read from the data stays inside the step
STATELESS = [PatchCase(name, build, _relative_lengths, {0: {0: "batch", 1: "time"}, 1: {0: "batch"}},
                       sizes=((1, 7), (4, 33), (1, 36), (2, 36)), example=(3, 9), exporters=("dynamo",),
                       graph=_one_scan, atol=1e-5, rtol=1e-4,
                       vanilla={"dynamo": _SPECIALISED})  # torch.onnx refines the batch to the example's
             for name, build in (("item_statistics", ItemStatistics),
                                 ("item_means_only", lambda: ItemStatistics(return_std=False)))]
test_stateless_loop_exports_as_a_scan, test_vanilla_stateless_loop_fails_as_recorded = patch_case_tests(STATELESS)


@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="the dynamo exporter is used from torch 2.13 on")
@pytest.mark.skipif("dynamo" not in EXPORTERS, reason="the dynamo exporter is used from torch 2.13 on")
def test_without_the_second_trace_the_step_is_refused(monkeypatch):
    """The failure the second trace answers, recorded: traced once, under torch.onnx's flag, the step's fake
    run fails (the mask's size symbol against ``[B, 16]``) and the loop is refused at its line."""
    import onnx_compat
    from onnx_compat.errors import UnsupportedPattern
    monkeypatch.setattr(scan_traces, "_UNBROADCAST", scan_traces.re.compile(r"(?!x)x"))
    line = MaskedLiGRU._cell.__code__.co_firstlineno + 3
    with onnx_compat.patched(), pytest.raises(UnsupportedPattern) as refused:
        bare_onnx(MaskedLiGRU().eval(), _inputs(3, 9, 0), "dynamo", {0: {0: "batch", 1: "time"}})
    assert f"pattern_models_round3i.py:{line}: range() takes the dynamic size" in str(refused.value)
    assert "does not trace as a scan step" in str(refused.value), str(refused.value)[:400]


def _frame_counts(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(1, T + 1, (B,), generator=g)
    frames[0] = T
    return torch.randn(B, T, 8, generator=g), frames.float()


# a layer's TypeError, caught by the model, left torch.fx's module stack behind (caught_module_errors)
TRIES = PatchCase("tries_with_lengths", TriesWithLengths, _frame_counts, {0: {0: "batch", 1: "time"},
                  1: {0: "batch"}}, example=(3, 9), exporters=("dynamo",),
                  vanilla={"dynamo": "Unexpected key _export_root.blocks.3, expected _export_root"})
test_caught_module_error_exports, test_vanilla_caught_module_error_fails_as_recorded = patch_case_tests([TRIES])
