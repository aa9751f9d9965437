"""``streamify(model)``: the streaming step of a model built from causal layers, derived from its graph.

Each causal ``Conv1d`` (see ``causal_layers``) is rewritten to run on its
cached last ``d*(k-1)`` input frames followed by the chunk, and hands the
last ``d*(k-1)`` frames of that on as its new state; each unidirectional
RNN runs from the (h, c) the previous chunk left. Everything else is
frame-wise and is left as it is. The step is checked before it is returned:
streamed in uneven chunks, it must give the full forward's output exactly
(float32 rounding aside), or the model is refused.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..runtimes.compare import closeness
from ..spec import Dim
from .causal_layers import CausalConv, Layers, Recurrent, find_layers, record, time_axes
from .errors import NotStreamable
from .states import StateSpec


class CachedConv(nn.Module):
    """The wrapped conv without its padding: its input already starts with the cached frames."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        return F.conv1d(x, c.weight, c.bias, 1, 0, c.dilation, c.groups)


def last_frames(x: torch.Tensor, count: int) -> torch.Tensor:
    return x[..., -count:]


class StreamStep(nn.Module):
    """``forward(chunk, *states) -> (output, *new_states)``; ``states``: the ``StateSpec`` list to export with."""

    def __init__(self, graph: fx.GraphModule, states: List[StateSpec], model: nn.Module, batch: Dim) -> None:
        super().__init__()
        self.graph_module = graph
        self.states = states
        self.batch_name = batch.name
        object.__setattr__(self, "full_forward", model)  # not a submodule: the weights are already the graph's

    def forward(self, chunk: torch.Tensor, *states: torch.Tensor):
        return self.graph_module(chunk, *states)

    def init_states(self, batch: int) -> List[torch.Tensor]:
        return [s.initial({self.batch_name: batch}) for s in self.states]


def _trace(model: nn.Module) -> fx.GraphModule:
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - fx's refusal, named
        raise NotStreamable(f"torch.fx cannot trace {type(model).__name__} ({type(exc).__name__}: {exc}); streamify "
                            "needs a forward without data-dependent Python control flow", module=type(model).__name__) from exc
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise NotStreamable(f"{type(model).__name__}.forward takes {len(inputs)} inputs; streamify takes models of "
                            "one [B, T, F] tensor", module=type(model).__name__)
    return gm


def _example(model: nn.Module, example: Optional[torch.Tensor], time_axis: int) -> torch.Tensor:
    if example is not None:
        return example
    first = next((m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d) + tuple(_RNN_TYPES))), None)
    if first is None:
        raise NotStreamable("give example= (a [B, T, F] tensor): no first layer to read the feature size from")
    features = first.in_features if isinstance(first, nn.Linear) else \
        first.in_channels if isinstance(first, nn.Conv1d) else first.input_size
    shape = [2, features]
    shape.insert(time_axis, 16)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


_RNN_TYPES = (nn.LSTM, nn.GRU, nn.RNN)


def streamify(model: nn.Module, example: Optional[torch.Tensor] = None, *, time_axis: int = 1,
              batch: Dim = Dim("batch"), check: bool = True) -> StreamStep:
    """The step of ``model`` (one ``[B, T, F]`` input, time on ``time_axis``) with its states declared.

    ``example``: an input to probe the graph with (default: random, the feature size read from the first
    layer). The returned module's ``states`` go to ``export_streaming`` as they are, with
    ``init_states=step.init_states`` unneeded (zeros) and ``full_forward=model``.
    """
    was_training = model.training
    model.eval()
    try:
        gm = _trace(model)
        x = _example(model, example, time_axis)
        longer = torch.randn(*[s + 5 if i == time_axis else s for i, s in enumerate(x.shape)],
                             generator=torch.Generator().manual_seed(1)).to(x.dtype)
        short, long = record(gm, x), record(gm, longer)
        layers = find_layers(gm, short, long, x.shape[time_axis])
        if not layers.convs and not layers.rnns:
            raise NotStreamable(f"{type(model).__name__} has no causal conv or RNN: it is frame-wise, export() "
                                "streams it as it is", module=type(model).__name__)
        step = StreamStep(*_build(gm, layers, batch), model, batch)
        step.output_time_axis = _output_axis(gm, short, long)
        if check:
            _check_exact(step, model, x, time_axis)
        return step
    finally:
        model.train(was_training)


def _build(gm: fx.GraphModule, layers: Layers, batch: Dim):
    graph, env, modules = fx.Graph(), {}, {}
    nodes = list(gm.graph.nodes)
    for node in nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    specs: List[StateSpec] = []
    placeholders: Dict[object, List[fx.Node]] = {}
    for conv in layers.convs:
        name = _state_name(conv.conv.target)
        specs.append(StateSpec(f"{name}_cache", [batch, conv.channels, conv.context]))
        placeholders[conv] = [graph.placeholder(specs[-1].name)]
    for rnn in layers.rnns:
        name, m = _state_name(rnn.node.target), rnn.module
        h_size = getattr(m, "proj_size", 0) or m.hidden_size
        names = ["h", "c"] if isinstance(m, nn.LSTM) else ["h"]
        sizes = [h_size, m.hidden_size]
        for k, suffix in enumerate(names):
            specs.append(StateSpec(f"{name}_{suffix}", [m.num_layers, batch, sizes[k]]))
        placeholders[rnn] = [graph.placeholder(s.name) for s in specs[-len(names):]]
    by_conv = {c.conv: c for c in layers.convs}
    by_rnn = {r.node: r for r in layers.rnns}
    dropped = {n for c in layers.convs for n in c.replaced}
    new_states: List[fx.Node] = []
    for node in nodes:
        if node.op == "placeholder" or node in dropped:
            continue
        if node in by_conv:
            new_states.append(_cached_conv(graph, env, modules, gm, by_conv[node], placeholders[by_conv[node]][0]))
        elif node in by_rnn:
            new_states += _stateful_rnn(graph, env, modules, gm, by_rnn[node], placeholders[by_rnn[node]])
        elif node.op == "output":
            graph.output((fx.node.map_arg(node.args[0], lambda n: env[n]), *new_states))
        else:
            if node.op == "call_module":
                modules[node.target] = gm.get_submodule(node.target)
            elif node.op == "get_attr":
                modules[node.target] = _attr(gm, node.target)
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(modules, graph, class_name="StreamifiedStep"), specs


def _attr(gm, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _state_name(target: str) -> str:
    return str(target).replace(".", "_")


def _cached_conv(graph, env, modules, gm, conv: CausalConv, state: fx.Node) -> fx.Node:
    name = f"cached_{_state_name(conv.conv.target)}"
    modules[name] = CachedConv(gm.get_submodule(conv.conv.target))
    joined = graph.call_function(torch.cat, ([state, env[conv.source]],), {"dim": -1})
    env[conv.result] = graph.call_module(name, (joined,))
    return graph.call_function(last_frames, (joined, conv.context))


def _stateful_rnn(graph, env, modules, gm, rnn: Recurrent, states: Sequence[fx.Node]) -> List[fx.Node]:
    modules[rnn.node.target] = rnn.module
    hidden = tuple(states) if len(states) == 2 else states[0]
    call = graph.call_module(rnn.node.target, (env[rnn.node.args[0]], hidden))
    env[rnn.node] = call
    last = graph.call_function(_getitem, (call, 1))
    if len(states) == 1:
        return [last]
    return [graph.call_function(_getitem, (last, 0)), graph.call_function(_getitem, (last, 1))]


def _getitem(value, index: int):
    return value[index]


def _output_axis(gm: fx.GraphModule, short, long) -> int:
    """The time axis of the model's (first) output, where the concatenated stream is compared."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    first = next(iter(output.all_input_nodes), None)
    axis = time_axes(short, long).get(first)
    if axis is None or axis < 0:
        raise NotStreamable("the model's output has no single time axis", module=type(gm).__name__)
    return axis


def _check_exact(step: StreamStep, model: nn.Module, x: torch.Tensor, time_axis: int) -> None:
    """Streamed in uneven chunks (1 frame included) the step must give the full forward's output."""
    total = x.shape[time_axis]
    cuts = [c for c in (5, 1, 4, 2, 3) if c <= total] or [total]
    with torch.no_grad():
        full = model(x)
        states, pieces, start = step.init_states(x.shape[0]), [], 0
        while start < total:
            size = min(cuts[len(pieces) % len(cuts)], total - start)
            out, *states = step(x.narrow(time_axis, start, size), *states)
            pieces.append(out)
            start += size
        streamed = torch.cat(pieces, dim=step.output_time_axis)
    close = closeness(streamed, full, 1e-5, 1e-4)
    if not close.ok:
        err = close.max_abs_err
        raise NotStreamable(f"the derived step does not reproduce {type(model).__name__}'s full forward (max abs "
                            f"err {err:.3g} over {len(pieces)} chunks): a layer mixes time in a way streamify did not "
                            "detect", module=type(model).__name__)
