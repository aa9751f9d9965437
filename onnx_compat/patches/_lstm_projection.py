"""``nn.LSTM(proj_size>0)`` (LSTMP) written as a loop over time that both exporters can write.

ONNX's ``LSTM`` has no projection, and the projected state feeds the next
step, so the cell must be written out. Under the dynamo exporter the loop is
``torch``'s ``scan`` higher-order op, which the exporter writes as ONNX
``Scan``; under the TorchScript exporter it is a scripted function, whose
``for`` loop the exporter writes as ONNX ``Loop``. Either way T stays
dynamic and the weights are ordinary initializers.

Per step (PyTorch's formulas, gates in PyTorch's (i, f, g, o) order):
``c' = σ(f)·c + σ(i)·tanh(g)``, ``h' = (σ(o)·tanh(c')) W_hr^T``. With
sequence lengths (packed input) a frame past a sequence's end keeps the state
and outputs 0; the backward direction therefore starts at each sequence's
own end, as packing does.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor



from onnx_compat.patches import when


def _step(xw: Tensor, keep: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, w_hr: Tensor):
    gates = xw + torch.matmul(h, w_hh.t())
    i, f, g, o = gates.chunk(4, -1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_new = torch.matmul(torch.sigmoid(o) * torch.tanh(c_new), w_hr.t())
    keep = keep.unsqueeze(-1)
    return torch.where(keep, h_new, h), torch.where(keep, c_new, c), torch.where(keep, h_new, torch.zeros_like(h_new))


@torch.jit.script
def _scripted_loop(xw: Tensor, valid: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, w_hr: Tensor,
                   reverse: bool) -> Tuple[Tensor, Tensor, Tensor]:
    steps = xw.size(0)
    ys: List[Tensor] = []
    for k in range(steps):
        t = steps - 1 - k if reverse else k
        gates = xw[t] + torch.matmul(h, w_hh.t())
        i, f, g, o = gates.chunk(4, -1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.matmul(torch.sigmoid(o) * torch.tanh(c_new), w_hr.t())
        keep = valid[t].unsqueeze(-1)
        h = torch.where(keep, h_new, h)
        c = torch.where(keep, c_new, c)
        ys.append(torch.where(keep, h_new, torch.zeros_like(h_new)))
    y = torch.stack(ys)
    return (y.flip(0) if reverse else y), h, c


def _scan_loop(xw, valid, h, c, w_hh, w_hr, reverse: bool):
    from torch._higher_order_ops.scan import scan

    def combine(carry, inputs):
        h_new, c_new, y = _step(inputs[0], inputs[1], carry[0], carry[1], w_hh, w_hr)
        return (h_new, c_new), y

    (h, c), y = scan(combine, (h, c), (xw, valid), reverse=reverse)
    return y, h, c


def _direction(xs, valid, h0, c0, weights, has_biases: bool, reverse: bool):
    if has_biases:
        w_ih, w_hh, b_ih, b_hh, w_hr = weights
        xw = torch.matmul(xs, w_ih.t()) + (b_ih + b_hh)
    else:
        w_ih, w_hh, w_hr = weights
        xw = torch.matmul(xs, w_ih.t())
    loop = _scan_loop if when.dynamo_exporting() else _scripted_loop
    return loop(xw, valid, h0, c0, w_hh, w_hr, reverse)


def lstm_projected(module: torch.nn.LSTM, x: Tensor, lengths: Optional[Tensor], hx, batch_first: bool):
    """``module(x, hx)`` for an ``nn.LSTM`` with ``proj_size``; ``lengths`` for packed input."""
    xs = x.transpose(0, 1) if batch_first else x  # [T, B, I]
    steps, batch = xs.shape[0], xs.shape[1]
    directions = 2 if module.bidirectional else 1
    if hx is None:
        h0 = xs.new_zeros(module.num_layers * directions, batch, module.proj_size)
        c0 = xs.new_zeros(module.num_layers * directions, batch, module.hidden_size)
    else:
        h0, c0 = hx
    if lengths is None:
        valid = torch.ones_like(xs[:, :, 0], dtype=torch.bool)
    else:
        valid = torch.arange(steps, device=xs.device)[:, None] < lengths.to(xs.device)[None, :]
    per_direction = 5 if module.bias else 3
    weights = [getattr(module, name) for name in module._flat_weights_names]  # as the exporter sees them now
    h_n: List[Tensor] = []
    c_n: List[Tensor] = []
    for layer in range(module.num_layers):
        outputs = []
        for d in range(directions):
            index = layer * directions + d
            w = weights[index * per_direction:(index + 1) * per_direction]
            y, h, c = _direction(xs, valid, h0[index].contiguous(), c0[index].contiguous(), w, module.bias,
                                 reverse=d == 1)  # scan needs its carry laid out as the step returns it
            outputs.append(y)
            h_n.append(h)
            c_n.append(c)
        xs = torch.cat(outputs, -1) if directions > 1 else outputs[0]
    y = xs.transpose(0, 1) if batch_first else xs
    return y, (torch.stack(h_n), torch.stack(c_n))
