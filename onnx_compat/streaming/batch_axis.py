"""The eager pre-pass again at a second batch size: a state whose declared batch axis the step does not use.

At the example's batch size a state declared ``[batch, 2, 32]`` for an LSTM's
``[layers=2, batch, 32]`` fits whenever the batch is 2: the step runs, and the
mistake surfaces only inside an exporter, as a size frozen at a line of
``torch/nn/modules/rnn.py``. One more batch size (the example's + 1) tells the
axes apart before any exporter runs; the error names the state, the axis
declared and the axis the step takes the batch on.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch

from ..spec import Dim
from .errors import StreamingError
from .probe import check_states, run_step
from .verify_stream import chunk_at, make_stream


def check_second_batch(step, d, init_fn: Optional[Callable], none_first: bool, seed: int) -> None:
    """Two chunks through the eager step at batch ``example + 1``; a failure is blamed on the state whose batch
    axis is declared where the step does not take it (or reported as it is, with the batch size said)."""
    if not d.batch_dim:
        return
    example = d.sizes.get(d.batch_dim, 1)
    second = example + 1
    sizes = {**d.sizes, d.batch_dim: second}
    stream = make_stream(d.inputs, sizes, d.plan, seed)
    init = d.layout.initial(sizes, init_fn, second)
    try:
        _run(step, d, sizes, stream, [None] * len(init) if none_first else init, init)
    except StreamingError as exc:
        blamed = _blame(step, d, sizes, stream, init, exc, example, second)
        raise blamed from exc


def _run(step, d, sizes, stream, states: List[Optional[torch.Tensor]], init: List[torch.Tensor]) -> None:
    for c in range(2):
        got = run_step(step, chunk_at(d.inputs, stream, d.plan, c), states, d.outputs, d.plan.chunk)
        check_states(d.layout, init if states[0] is None else states, got.states, sizes)
        states = got.states


def _blame(step, d, sizes, stream, init, exc: StreamingError, example: int, second: int) -> StreamingError:
    """Try each state with its batch moved to another axis: the one the step then runs with is the culprit."""
    for k, spec in enumerate(d.layout.flat):
        axes = [i for i, dim in enumerate(spec.dims) if isinstance(dim, Dim) and dim.name == d.batch_dim]
        if len(axes) != 1:
            continue
        declared = axes[0]
        for other in range(len(spec.dims)):
            if other == declared or not isinstance(spec.dims[other], int):
                continue
            moved = list(init)
            moved[k] = init[k].transpose(declared, other).contiguous()
            swapped = _swapped(d, k, declared, other)
            try:
                _run(step, swapped, sizes, stream, moved, moved)
            except StreamingError:
                continue
            dims = "[" + ", ".join(x.name if isinstance(x, Dim) else str(x) for x in swapped.layout.flat[k].dims) + "]"
            return StreamingError(
                f"state {spec.name!r}: declared {spec.describe()['dims']} with the batch {d.batch_dim!r} on axis "
                f"{declared}, but the step takes the batch on axis {other}: at batch {second} (the example's "
                f"{example} + 1) it refuses shape {list(init[k].shape)} and runs with {list(moved[k].shape)}; "
                f"declare StateSpec({spec.name!r}, {dims})", state=spec.name, batch=second)
    return StreamingError(f"at batch {second} (the example's {example} + 1) the eager step fails: {exc} [each "
                          f"state's {d.batch_dim!r} axis must be the one the step takes the batch on]",
                          state=exc.state, output=exc.output, chunk=exc.chunk, batch=second)


def _swapped(d, k: int, declared: int, other: int):
    """``d`` with state ``k``'s dims ``declared`` and ``other`` exchanged (the layout copied, ``d`` untouched)."""
    import copy
    import dataclasses
    flat = list(d.layout.flat)
    dims = list(flat[k].dims)
    dims[declared], dims[other] = dims[other], dims[declared]
    layout = copy.copy(d.layout)
    layout.flat = flat[:k] + [dataclasses.replace(flat[k], dims=dims)] + flat[k + 1:]
    return dataclasses.replace(d, layout=layout)
