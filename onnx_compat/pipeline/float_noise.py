"""A check that failed by float32 rounding alone, judged again against the model's float64 result.

A graph that computes the same function in another order rounds differently. Where the function is
ill-conditioned, both float32 results stray from the exact one by more than the tolerance, and comparing one
with the other fails a graph that is right: ClearVoice FRCRN's iSTFT divides by an overlap-add envelope that
falls to 2e-4 at the signal's edge, where eager float32 is 4.9e-4 from its own float64 result and ONNX Runtime
3.0e-4 (issue #47; eager against ONNX: 1.75e-3, atol 1e-4).

So a check that failed on values alone (every shape and length right) is judged again: the unpatched model runs
in float64 on the same inputs (a copy; the user's model is left as it was; tensors it makes in ``forward`` at the
default dtype, a window, are made in float64 too), and the graph passes where it is within the tolerance of that
result widened by twice PyTorch's own float32 error on those inputs (its largest deviation from float64 over the
compared elements): the graph's rounding, in another order of operations, is of the size of eager's, not below
it (nara-wpe's WPE, a solve per bin of little power: eager float32 3.40e-3 from float64, the dynamo graph
3.60e-3, the TorchScript one 2.90e-3; held to eager's own error, a graph as good as eager passes about half the
time). That error must itself be small beside the output (at most ``NOISE_SHARE`` of its largest magnitude): a
float32 model that far from its float64 self is no reference, and the check stays failed. NaN and infinities, shapes and lengths are judged as before; a model that does not run
in float64, or whose weights are past ``LARGEST_COPY``, keeps its failure.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from onnx_compat.model_state import preserved
from onnx_compat.patches.compiled import uncompiled
from onnx_compat.pipeline.adapter import IOAdapter, flatten
from onnx_compat.pipeline.subject import own_copies
from onnx_compat.pipeline.weights import weight_bytes
from onnx_compat.runtimes.compare import closeness, valid_mask
from onnx_compat.spec import TensorSpec, forward_arguments, size_name

NOISE_SHARE = 1e-2
NOISE_FACTOR = 2.0  # the graph's own float32 error may be up to this many times eager's
LARGEST_COPY = 1 << 28  # bytes of float32 weights: past 256 MiB the float64 copy (twice that) is not made


def float64_outputs(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                    feeds: Dict[str, torch.Tensor]) -> Optional[List[np.ndarray]]:
    """The unpatched model's outputs in float64 on ``feeds`` (float inputs cast), or None where it does not run so,
    or its weights are past ``LARGEST_COPY`` (the copy would add twice their size to the export's peak memory)."""
    if weight_bytes(model) > LARGEST_COPY:
        return None
    try:
        twin = copy.deepcopy(model).double()
        cast = [t.double() if t.is_floating_point() else t for t in feeds.values()]
        with preserved(twin), torch.no_grad(), uncompiled(), _float64_made():
            reference = IOAdapter(twin, forward_arguments(twin, inputs), outputs)
            return [t.detach().cpu().numpy() for t in flatten(reference(*own_copies(cast)))]
    except Exception:  # noqa: BLE001 - a model bound to float32 (a dtype written in its code) keeps its failure
        return None


@contextlib.contextmanager
def _float64_made():
    """Tensors the model makes in ``forward`` at the default dtype (a window, an identity, zeros) in float64 too,
    as the weights and inputs are: ``torch.hann_window(n)`` in float32 beside float64 frames stops the STFT."""
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(was)


def rejudged(check, got: Dict[str, np.ndarray], expected: List[np.ndarray], exact: List[np.ndarray],
             outputs: Sequence[TensorSpec], atol: float, rtol: float):
    """``check`` (a ``ShapeCheck`` failed on values) with each failed float output judged against ``exact``."""
    judged, i = [], 0
    for spec, output in zip(outputs, check.outputs):
        lengths = {axis: expected[i + 1 + k] for k, axis in enumerate(spec.lengths)}
        if not output.ok and np.issubdtype(expected[i].dtype, np.floating):
            output = _against_exact(output, got[spec.name], expected[i], exact[i],
                                    valid_mask(expected[i].shape, lengths), atol, rtol)
        judged.append(output)
        i += 1 + len(spec.lengths)
    return replace(check, outputs=judged)


def _against_exact(output, got: np.ndarray, expected: np.ndarray, exact: np.ndarray, mask: np.ndarray,
                   atol: float, rtol: float):
    if exact.shape != expected.shape or not mask.any():
        return output
    both = mask & np.isfinite(expected) & np.isfinite(exact)
    if not both.any():
        return output
    noise = float(np.abs(expected[both].astype(np.float64) - exact[both]).max())
    if noise > NOISE_SHARE * float(np.abs(exact[both]).max()):
        return output
    close = closeness(got.astype(np.float64), exact, atol + NOISE_FACTOR * noise, rtol, mask)
    if not close.ok:
        return output
    return replace(output, ok=True, float32_noise=noise, max_abs_err_float64=close.max_abs_err)


def outputs_of(run, feeds: Dict[str, torch.Tensor], outputs: Sequence[TensorSpec]) -> Dict[str, np.ndarray]:
    """The graph's outputs by name on ``feeds`` (``run``: feeds by name -> outputs by name)."""
    wanted = {spec.name for spec in outputs} | {size_name(s.name, a) for s in outputs for a in s.lengths}
    return {k: v for k, v in run({k: v.numpy() for k, v in feeds.items()}).items() if k in wanted}
