"""``torch.autograd.grad`` called by a model's forward, met while an export traces.

Structured-prediction libraries compute marginals as the gradient of the log partition: torch-struct's
``helpers.py`` sets ``requires_grad_(True)`` on the potentials and calls ``torch.autograd.grad`` of the
partition inside ``marginals``. An ONNX graph holds the forward computation, and neither exporter traces a
backward pass (torch 2.13, measured on ``x.logsumexp((1, 2)).sum()``'s gradient): the TorchScript trace fails
far from the call ("Cannot insert a Tensor that requires grad as a constant", which the pipeline read as a
module kept in a global), ``torch.export`` fails with no line of the model. While an export traces, a call
made by the model's own code is refused at its line, saying what would make the model exportable. Torch's own
uses of ``autograd.grad`` (its caller in torch) are left alone.
"""
from __future__ import annotations

import os

from onnx_compat.errors import UnsupportedPattern
from onnx_compat.patches.registry import Patch, register
from ._warning_site import _TORCH, frame_site, model_frame


def _refuse_grad(wrapped, instance, args, kwargs):
    frame = model_frame()
    if frame is None or os.path.abspath(frame.f_code.co_filename).startswith(_TORCH):
        return wrapped(*args, **kwargs)
    raise UnsupportedPattern(
        f"{frame_site(frame)}: torch.autograd.grad inside the model's forward: an ONNX graph holds the forward "
        f"computation only, and neither exporter traces a backward pass through it. To export, compute that "
        f"gradient in the forward itself (for a CRF's marginals: a forward-backward pass over the chart, or "
        f"softmax-normalised inside/outside scores), or export the function and differentiate outside the graph")


register(Patch(
    name="autograd_in_forward",
    description="torch.autograd.grad called by the model's forward (marginals as the gradient of a log "
                "partition) is refused at the model's line with what would make it exportable, instead of "
                "TorchScript's 'Cannot insert a Tensor that requires grad as a constant'",
    targets=("torch.autograd:grad",),
    wrapper=_refuse_grad,
    when="export",
))
