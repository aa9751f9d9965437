"""ONNX translations of the ``onnx_compat::rnn`` custom ops: one ONNX LSTM/GRU node per layer.

Called by the dynamo exporter while it builds the graph (``custom_translation_
table``); tensors are graph values, the attributes plain Python values, so the
loop over layers unrolls here, once, not per time step. Gate orders differ:
PyTorch stores LSTM gates as (i, f, g, o) and ONNX wants (i, o, f, c); GRU
(r, z, n) against ONNX's (z, r, h), with ``linear_before_reset=1`` being
PyTorch's GRU formula. The weight reordering is constant and folds away.
"""
from __future__ import annotations

from typing import Sequence

from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

_GATE_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


def _reorder(w, mode: str, hidden: int):
    """Gate blocks of ``hidden`` rows in ONNX order. Slices, not one Split: constant
    folding handles single-output ops, so the reordering of constant weights folds away."""
    parts = [op.Slice(w, [g * hidden], [(g + 1) * hidden], [0]) for g in _GATE_ORDER[mode]]
    return op.Concat(*parts, axis=0)


def _layer_weights(params, first: int, directions: int, has_biases: bool, mode: str, hidden: int):
    per_direction = 4 if has_biases else 2
    W, R, B = [], [], []
    for d in range(directions):
        base = first + d * per_direction
        W.append(op.Unsqueeze(_reorder(params[base], mode, hidden), [0]))
        R.append(op.Unsqueeze(_reorder(params[base + 1], mode, hidden), [0]))
        if has_biases:
            bias = op.Concat(_reorder(params[base + 2], mode, hidden), _reorder(params[base + 3], mode, hidden),
                             axis=0)
            B.append(op.Unsqueeze(bias, [0]))
    join = (lambda xs: op.Concat(*xs, axis=0)) if directions > 1 else (lambda xs: xs[0])
    return join(W), join(R), (join(B) if has_biases else None)


def _rnn(x, lengths, hx, params, mode: str, num_layers: int, bidirectional: bool, batch_first: bool,
         has_biases: bool):
    directions = 2 if bidirectional else 1
    hidden = hx[0].shape[2]
    if batch_first:
        x = op.Transpose(x, perm=[1, 0, 2])
    seq_lens = None if lengths is None else op.Cast(lengths, to=6)  # INT32, as ONNX requires
    per_layer = (4 if has_biases else 2) * directions
    h_out, c_out = [], []
    for layer in range(num_layers):
        W, R, B = _layer_weights(params, layer * per_layer, directions, has_biases, mode, hidden)
        h0 = op.Slice(hx[0], [layer * directions], [(layer + 1) * directions], [0])
        kwargs = dict(direction="bidirectional" if bidirectional else "forward", hidden_size=hidden)
        if mode == "LSTM":
            c0 = op.Slice(hx[1], [layer * directions], [(layer + 1) * directions], [0])
            y, h_n, c_n = op.LSTM(x, W, R, B, seq_lens, h0, c0, **kwargs)
            c_out.append(c_n)
        else:
            y, h_n = op.GRU(x, W, R, B, seq_lens, h0, linear_before_reset=1, **kwargs)
        h_out.append(h_n)
        # [T, D, B, H] -> [T, B, D*H]
        x = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
    if batch_first:
        x = op.Transpose(x, perm=[1, 0, 2])
    h = op.Concat(*h_out, axis=0) if num_layers > 1 else h_out[0]
    c = (op.Concat(*c_out, axis=0) if num_layers > 1 else c_out[0]) if mode == "LSTM" else op.Identity(h)
    return x, h, c


def rnn(x: TFloat, hx: Sequence[TFloat], params: Sequence[TFloat], mode: str, num_layers: int, bidirectional: bool,
        batch_first: bool, has_biases: bool):
    return _rnn(x, None, hx, params, mode, num_layers, bidirectional, batch_first, has_biases)


def rnn_packed(x: TFloat, lengths, hx: Sequence[TFloat], params: Sequence[TFloat], mode: str, num_layers: int,
               bidirectional: bool, batch_first: bool, has_biases: bool):
    return _rnn(x, lengths, hx, params, mode, num_layers, bidirectional, batch_first, has_biases)
