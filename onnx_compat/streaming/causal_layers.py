"""What ``streamify`` finds in a model's graph: its causal convolutions, its RNNs, and whether the rest is frame-wise.

The model is traced with ``torch.fx`` and run at two lengths; a value's time
axis is the axis whose size follows the input's. Then:

- a ``Conv1d`` (stride 1, zeros padding, time last) is causal when its input
  is ``F.pad(x, (d*(k-1), 0))`` and it pads nothing itself, or when it pads
  ``d*(k-1)`` on both sides and its output loses the last ``d*(k-1)`` frames
  (``y[..., :-p]``, a TCN's chomp); it keeps ``d*(k-1)`` input frames as its
  state. Any other padding looks ahead (or shortens time): refused.
- ``LSTM``/``GRU``/``RNN``: unidirectional, called without an initial state,
  its final state unused by the model; it keeps ``h`` (and ``c``).
- every other operation must be frame-wise: its output frame t may depend only
  on input frame t. That is measured, not listed: each op is re-run with one
  input frame changed, and a change anywhere else (attention, a norm over
  time, a cumsum, a symmetric pad) refuses the model, naming the module or op.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from .errors import NotStreamable

RNNS = (nn.LSTM, nn.GRU, nn.RNN)


@dataclass(eq=False)
class CausalConv:
    conv: fx.Node
    source: fx.Node  # the input before any left padding
    result: fx.Node  # the node whose value the streamed conv replaces (the conv, or its chomp)
    replaced: Tuple[fx.Node, ...]  # pad / chomp nodes that disappear
    context: int  # dilation * (kernel - 1) frames kept
    channels: int


@dataclass(eq=False)
class Recurrent:
    node: fx.Node
    module: nn.Module


@dataclass
class Layers:
    convs: List[CausalConv] = field(default_factory=list)
    rnns: List[Recurrent] = field(default_factory=list)
    pointwise_convs: List[fx.Node] = field(default_factory=list)


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values: Dict[fx.Node, object] = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n] = out
        return out


def record(gm: fx.GraphModule, x: torch.Tensor) -> Dict[fx.Node, object]:
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(x)
    return rec.values


def _tensor(value) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def time_axes(short: Dict[fx.Node, object], long: Dict[fx.Node, object]) -> Dict[fx.Node, Optional[int]]:
    """Per node: the axis whose size changed with the input length (None: no time axis; -1: several)."""
    axes: Dict[fx.Node, Optional[int]] = {}
    for node, value in short.items():
        a, b = _tensor(value), _tensor(long.get(node))
        if a is None or b is None or a.dim() != b.dim():
            axes[node] = None
            continue
        moved = [i for i, (p, q) in enumerate(zip(a.shape, b.shape)) if p != q]
        axes[node] = moved[0] if len(moved) == 1 else (None if not moved else -1)
    return axes


def where(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"module {node.target!r} ({type(gm.get_submodule(node.target)).__name__})"
    target = getattr(node.target, "__name__", str(node.target))
    return f"operation {target!r} (graph node {node.name!r})"


def _is_pad(node) -> bool:
    return node.op == "call_function" and node.target in (F.pad, torch.nn.functional.pad)


def _pad_amounts(node) -> Tuple[Optional[Sequence[int]], str, float]:
    pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", None)
    return (tuple(pad) if isinstance(pad, (tuple, list)) else None), mode, value or 0.0


def _chomp(node: fx.Node, amount: int) -> Optional[fx.Node]:
    """The single user of ``node`` if it is ``y[..., :-amount]`` on the last axis."""
    users = list(node.users)
    if len(users) != 1 or users[0].target is not operator.getitem:
        return None
    index = users[0].args[1]
    if not isinstance(index, tuple) or not index:
        return None
    last = index[-1]
    heads_ok = all(i == slice(None) or i is Ellipsis for i in index[:-1])
    if heads_ok and isinstance(last, slice) and last.start is None and last.step is None and last.stop == -amount:
        return users[0]
    return None


def causal_conv(gm, node: fx.Node, conv: nn.Conv1d, axes) -> Optional[CausalConv]:
    """The conv as a causal layer, None if it is frame-wise (k=1), or refused."""
    context = conv.dilation[0] * (conv.kernel_size[0] - 1)
    label = where(gm, node)
    if conv.stride[0] != 1:
        raise NotStreamable(f"{label}: stride {conv.stride[0]} (streamify keeps stride-1 convolutions only)",
                            module=node.target)
    if conv.padding_mode != "zeros":
        raise NotStreamable(f"{label}: padding_mode={conv.padding_mode!r} pads with frames it has not seen",
                            module=node.target)
    if axes.get(node.args[0]) not in (2, None) or axes.get(node) != 2:
        raise NotStreamable(f"{label}: time is not the last axis of its input", module=node.target)
    padding = conv.padding if isinstance(conv.padding, str) else conv.padding[0]
    padding = 0 if padding == "valid" else (context if padding == "same" else padding)
    if context == 0 and padding == 0:
        return None
    source = node.args[0]
    if padding == 0 and _is_pad(source) and len(source.users) == 1:
        amounts, mode, value = _pad_amounts(source)
        if amounts is not None and len(amounts) == 2 and tuple(amounts) == (context, 0) and mode == "constant" \
                and value == 0:
            return CausalConv(node, source.args[0], node, (source,), context, conv.in_channels)
    chomp = _chomp(node, padding) if padding == context else None
    if chomp is not None:
        return CausalConv(node, source, chomp, (chomp,), context, conv.in_channels)
    raise NotStreamable(f"{label}: not causal. Its output frame t must see input frames t-{context}..t only: pad "
                        f"{context} frames on the left (F.pad(x, ({context}, 0)) before a padding=0 conv, or "
                        f"padding={context} with the last {context} output frames dropped); got padding={padding}"
                        + (" after an F.pad of " + str(_pad_amounts(source)[0]) if _is_pad(source) else ""),
                        module=node.target)


def recurrent(gm, node: fx.Node, module: nn.Module) -> Recurrent:
    label = where(gm, node)
    if module.bidirectional:
        raise NotStreamable(f"{label}: bidirectional; its backward direction reads the future, a stream has none",
                            module=node.target)
    if len(node.args) + len(node.kwargs) > 1:
        raise NotStreamable(f"{label}: called with its own initial state; streamify supplies it", module=node.target)
    for user in node.users:
        if user.target is not operator.getitem or (user.args[1] != 0 and user.users):
            raise NotStreamable(f"{label}: the model uses its final state (h_n), which summarises the whole "
                                "utterance; only its per-frame output streams", module=node.target)
    return Recurrent(node, module)


def find_layers(gm: fx.GraphModule, short, long, length: int) -> Layers:
    """Every causal conv and RNN of the graph; every other op checked frame-wise (``NotStreamable`` if not)."""
    axes = time_axes(short, long)
    layers = Layers()
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        if isinstance(module, nn.Conv1d):
            found = causal_conv(gm, node, module, axes)
            (layers.convs.append(found) if found else layers.pointwise_convs.append(node))
        elif isinstance(module, RNNS):
            layers.rnns.append(recurrent(gm, node, module))
        elif isinstance(module, (nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d)):
            raise NotStreamable(f"{where(gm, node)}: streamify caches Conv1d only", module=node.target)
    special = {c.conv for c in layers.convs} | {r.node for r in layers.rnns} | set(layers.pointwise_convs)
    special |= {n for c in layers.convs for n in c.replaced}
    special |= {u for r in layers.rnns for u in r.node.users}
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_function", "call_method") and node not in special:
            _check_framewise(gm, node, short, axes, length)
    return layers


def _check_framewise(gm, node: fx.Node, values, axes, length: int) -> None:
    out = _tensor(values.get(node))  # a module's tuple (attention's output, weights): its first tensor
    if out is None:
        return  # sizes: their tensors are checked where they are used
    inputs = [a for a in node.all_input_nodes if isinstance(values.get(a), torch.Tensor) and axes.get(a) is not None]
    if not inputs:
        return
    label = where(gm, node)
    axis = axes.get(node)
    if axis is None:
        raise NotStreamable(f"{label} reduces the time axis: one chunk cannot give the utterance's value",
                            module=_module(node))
    if axis == -1 or out.shape[axis] != length:
        raise NotStreamable(f"{label} mixes frames across time (its output has {list(out.shape)} for {length} "
                            "input frames); attention needs a declared left context: write its step and use "
                            "export_streaming", module=_module(node))
    for source in inputs:
        if not _local(gm, node, values, source, axes[source], axis):
            what = ("is attention without a declared left context (every frame sees the whole utterance)"
                    if _is_attention(gm, node) else
                    "mixes frames across time (changing input frame t changes other output frames: a norm, pooling "
                    "or cumsum over time, or a look-ahead)")
            raise NotStreamable(f"{label} {what}; streamify caches causal Conv1d and RNN states only: write the "
                                "step with its caches and use export_streaming", module=_module(node))


_ATTENTION = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder,
              nn.Transformer)


def _is_attention(gm, node: fx.Node) -> bool:
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return isinstance(module, _ATTENTION) or "attention" in type(module).__name__.lower()
    return "attention" in getattr(node.target, "__name__", str(node.target))


def _module(node: fx.Node) -> Optional[str]:
    return node.target if node.op == "call_module" else node.name


def _local(gm, node, values, source, in_axis: int, out_axis: int) -> bool:
    """Does changing frame t of ``source`` change output frames other than t?"""
    base = _tensor(values[node])
    frame = base.shape[out_axis] // 2
    moved = values[source].clone()
    if not moved.dtype.is_floating_point:
        return True  # masks, positions: indices, not signals
    moved.select(in_axis, frame).add_(torch.linspace(0.7, 1.3, moved.select(in_axis, frame).numel())
                                      .reshape(moved.select(in_axis, frame).shape).to(moved.dtype))
    env = {n: (moved if n is source else v) for n, v in values.items()}
    args = fx.node.map_arg(node.args, lambda n: _copy(env[n]))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: _copy(env[n]))
    with torch.no_grad():
        if node.op == "call_module":
            again = gm.get_submodule(node.target)(*args, **kwargs)
        elif node.op == "call_function":
            again = node.target(*args, **kwargs)
        else:
            again = getattr(args[0], node.target)(*args[1:], **kwargs)
    diff = (_tensor(again).double() - base.double()).abs()
    others = torch.cat([diff.narrow(out_axis, 0, frame), diff.narrow(out_axis, frame + 1, base.shape[out_axis] - frame - 1)],
                       dim=out_axis)
    return bool(others.numel() == 0 or others.max() <= 1e-6 * (1.0 + float(base.abs().max())))


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value
