"""``torch.autograd.grad`` called by a model's forward, met while an export traces.

Structured-prediction libraries compute marginals as the gradient of the log partition: torch-struct's
``helpers.py`` sets ``requires_grad_(True)`` on the potentials and calls ``torch.autograd.grad`` of the
partition inside ``marginals``; force fields return the gradient of an energy the same way. The ONNX graph
must then hold the backward pass as ordinary ops.

Neither exporter's own capture records it (torch 2.13, measured on ``x.logsumexp((1, 2)).sum()``'s
gradient): the TorchScript trace fails far from the call ("Cannot insert a Tensor that requires grad as a
constant", which the pipeline read as a module kept in a global), and ``torch.export``'s pre-dispatch trace
sits above autograd, so the backward ops autograd runs are not in its graph ("a fake tensor in the exported
program constant's list", no line of the model). A trace below autograd (``torch.export`` with
``pre_dispatch=False``, the level AOTAutograd traces joint graphs at) records every op the autograd engine
runs for the gradient as it records the forward's. So: a call made by the model's own code while an export
traces is refused at its line (``GradientInForward``), and dynamo's non-strict capture answers that refusal
by capturing again at that level (``captured_with_backward``, called by ``strict_retry``), where the call
runs. Torch's own uses of ``autograd.grad`` (its caller in torch) are left alone.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import threading

import torch

from onnx_compat.errors import GradientInForward
from onnx_compat.patches import source_rewrites
from onnx_compat.patches.registry import Patch, register
from ._warning_site import _TORCH, frame_site, model_frame

_below_autograd = threading.local()  # set while the capture traces below autograd: the call then runs


def _aten_level_export():
    """torch.export's inner entry point that takes ``pre_dispatch``, or None on a torch without it."""
    try:
        export = getattr(importlib.import_module("torch.export._trace"), "_export", None)
    except ImportError:
        return None
    try:
        return export if export is not None and "pre_dispatch" in inspect.signature(export).parameters else None
    except (TypeError, ValueError):
        return None


def _refuse_grad(wrapped, instance, args, kwargs):
    frame = model_frame()
    if frame is None or os.path.abspath(frame.f_code.co_filename).startswith(_TORCH) \
            or getattr(_below_autograd, "on", False):
        return wrapped(*args, **kwargs)
    answer = ("the dynamo exporter captures it below autograd, where the backward pass is recorded as ops "
              "(exporter='dynamo' or 'auto')" if _aten_level_export() is not None else
              f"torch {torch.__version__} has no capture below autograd")
    raise GradientInForward(
        f"{frame_site(frame)}: torch.autograd.grad inside the model's forward: an ONNX graph holds its backward "
        f"pass only as ops a trace recorded, and this capture records none; {answer}. Else compute that gradient "
        f"in the forward itself (for a CRF's marginals: a forward-backward pass over the chart), or export the "
        f"function and differentiate outside the graph")


def captured_with_backward(model, args, kwargs, dynamic_shapes):
    """``torch.export`` of ``model`` below autograd (``pre_dispatch=False``), the model's ``autograd.grad``
    let run: its backward ops are recorded as the forward's are.

    The backward of a broadcast asks whether a size is 1 (which dims its gradient sums over), in autograd's
    own code: where torch.export then finds a declared range that includes 1, the dims' ranges are refined as
    torch suggests (what torch.onnx's own non-strict capture does), and the report says what the graph takes
    for granted. None where this torch has no such capture (the refusal then stands)."""
    export = _aten_level_export()
    if export is None:
        return None
    try:
        return _below(export, model, args, kwargs, dynamic_shapes)
    except torch._dynamo.exc.UserError as exc:
        refined = _refined(exc, dynamic_shapes)
        if refined is None:
            raise
        for guard in _violated(exc):
            source_rewrites.assume(f"the gradient's backward pass (below autograd): {guard}")
        return _below(export, model, args, kwargs, refined)


def _below(export, model, args, kwargs, dynamic_shapes):
    """``torch.export.export`` (the public call, so that the patches wrapping it act as in torch.onnx's own
    capture), its inner trace told ``pre_dispatch=False``."""
    trace = importlib.import_module("torch.export._trace")

    def below_autograd(*inner_args, **inner_kwargs):
        inner_kwargs["pre_dispatch"] = False
        return export(*inner_args, **inner_kwargs)
    _below_autograd.on, trace._export = True, below_autograd  # torch.export.export imports it at each call
    try:
        with torch.fx.experimental._config.patch(backed_size_oblivious=True):  # as torch.onnx's own capture
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    finally:
        _below_autograd.on, trace._export = False, export


def _refined(exc, dynamic_shapes):
    """The dynamic shapes with each dim whose range ``exc`` says includes a size the backward pass excluded
    (``T != 1``) starting at 2, or None where ``exc`` names no such dim."""
    ones = set(re.findall(r"Not all values of (\w+) = [^\n]*? != 1\.?$", str(exc), re.M))
    if not ones:
        return None

    def lifted(dim):
        if not isinstance(dim, torch.export.Dim) or getattr(dim, "__name__", None) not in ones \
                or (getattr(dim, "min", 0) or 0) > 1:
            return dim
        return torch.export.Dim(dim.__name__, min=2, max=dim.max)
    return torch.utils._pytree.tree_map(lifted, dynamic_shapes)


def _violated(exc) -> list:
    """The guards torch.export says a declared range violated, one line each ("time != 1")."""
    found = re.findall(r"Not all values of (\w+) = .*? satisfy the generated guard (.*?)\.?$", str(exc), re.M)
    return [f"{name} taken where {guard}" for name, guard in found] or [str(exc).splitlines()[0]]


register(Patch(
    name="autograd_in_forward",
    description="torch.autograd.grad called by the model's forward (marginals as the gradient of a log "
                "partition) is refused at the model's line, and dynamo's capture answers the refusal by tracing "
                "below autograd, where the backward pass is recorded as ops; TorchScript's stays the refusal, "
                "not 'Cannot insert a Tensor that requires grad as a constant'",
    targets=("torch.autograd:grad",),
    wrapper=_refuse_grad,
    when="export",
))
