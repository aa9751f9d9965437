"""Leave the user's model as it was, whatever an export or a check does to it.

The TorchScript exporter ends with ``model.train(root_flag)``, which sets every
submodule to the root's mode, and a forward may assign attributes while traced.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def preserved(model: torch.nn.Module, evaluate: bool = True) -> Iterator[None]:
    """Run the block in eval mode (``evaluate``; else in the mode the model is in); afterwards the model is as
    before.

    Restored: every module's training flag and plain attributes (its
    ``__dict__``: a forward that assigns ``self.window_size`` while tracing
    leaves a Tensor there; an attribute the block added is removed), every
    buffer (the same tensor object, with the same values), and every
    parameter's ``requires_grad``.
    """
    modules = list(model.modules())
    attributes = [dict(vars(m)) for m in modules]
    buffers = [{k: (b, None if b is None else b.detach().clone()) for k, b in m._buffers.items()} for m in modules]
    params = {name: (p, p.requires_grad) for name, p in model.named_parameters()}
    training = [m.training for m in modules]  # a ScriptModule keeps its flag in its compiled object, not in vars()
    try:
        if evaluate:
            model.eval()
        yield
    finally:
        for module, before, flag in zip(modules, attributes, training):
            _restore_attributes(module, before)
            if module.training != flag:
                module.training = flag
        for module, before in zip(modules, buffers):
            _restore_buffers(module, before)
        for name, p in model.named_parameters():
            if name in params and params[name][0] is p:
                p.requires_grad_(params[name][1])


def _restore_attributes(module: torch.nn.Module, before: dict) -> None:
    now = vars(module)
    for key in [k for k in now if k not in before]:
        del now[key]
    for key, value in before.items():
        if key not in now or now[key] is not value:
            now[key] = value


def _restore_buffers(module: torch.nn.Module, before: dict) -> None:
    # ``keys()``: a ScriptModule's ``_buffers`` is a wrapper that cannot be iterated (it indexes 0, 1, ...)
    for key in [k for k in module._buffers.keys() if k not in before]:
        del module._buffers[key]
    for key, (tensor, values) in before.items():
        module._buffers[key] = tensor
        if tensor is not None and not torch.equal(tensor.detach(), values):
            with torch.no_grad():
                tensor.copy_(values)
