"""A lifted loop's step traced as torch's ``scan``: retried where a value branch can be ``torch.where``, run
with its first step before the scan where that step changes the state's shape (``scanned_steps``), and
refused, saying why at the model's line, where the step does not trace.

``scan`` traces its step with dynamo, whose error names the kind of graph break on the line after "Got graph
break/error:" and the model's lines under "from user code:" (the innermost last); the refusal repeats those,
since torch's own first line says only that the step could not be captured.
"""
from __future__ import annotations

import contextlib
import re
from typing import Optional, Tuple

import torch

from onnx_compat.errors import CarryChanges, NotLiftable, StateOnModules, UnsupportedPattern

from . import module_state, value_branches
from .scan_steps import GatedSteps


def scanned(combine_with, carries, steps_in):
    """``scan`` of the step ``combine_with(branch lines)`` makes. Where the step's trace stops at a branch on a
    tensor's value, that ``if`` is taken as ``torch.where`` (in the step's own body, or in the function it
    calls, for as long as this scan is traced: ``value_branches.py``) and the step traced again."""
    from torch._higher_order_ops.scan import scan
    if not carries:  # a loop that only collects each step's outputs: scan wants a state, one is made up, dropped
        _, ys = scanned(lambda branches: _stateless(combine_with(branches)), (torch.zeros(()),), steps_in)
        return type(carries)(), ys
    branches, swaps, specialised = set(), contextlib.ExitStack(), False
    with swaps:
        for _ in range(value_branches.BRANCHES + 2):
            try:
                with _sizes_specialised() if specialised else contextlib.nullcontext():
                    return scan(combine_with(frozenset(branches)), carries, steps_in)
            except (UnsupportedPattern, NotLiftable):
                raise
            except Exception as error:  # the body could not be traced as a step: refused, naming why
                if _CHANGED in str(error):
                    raise CarryChanges(_changed(str(error))) from error
                if not specialised and _UNBROADCAST.search(str(error)):
                    specialised = True
                    continue
                kept = _state_kept_on_a_module(_user_frames(str(error))) if _GRAPH_BREAK in str(error) else ""
                if kept:
                    raise StateOnModules(f"its body does not trace as a scan step ({kept})") from error
                site = _value_branch(error)
                why = "" if site is None else _take_as_where(site, branches, swaps)
                if site is None or why:
                    raise NotLiftable(f"its body does not trace as a scan step ({_step_failure(error)}{why})") \
                        from error
    raise NotLiftable(f"its step branches on tensor values at more than {value_branches.BRANCHES} places")


_CHANGED = "Expected init and carry to have same metadata"
_GRAPH_BREAK = "Got graph break/error:"


# a step's trace that could not broadcast against a size it made a symbol of ("... tensor b (s69: hint = 1)")
_UNBROADCAST = re.compile(r"must match the size of tensor \w \(s\d+: hint = 1\)")


def _sizes_specialised():
    """torch.onnx captures with ``backed_size_oblivious`` (a dim of size 1 gets a symbol of its own, so an input
    of 1 is not baked); the step's trace fakes what it closes over anew, and under that flag a static ``[1]``
    tensor (speechbrain LiGRU's ``drop_mask_te``) became ``[s69]``, which ``[B, 16] * [s69]`` cannot broadcast.
    Where that stops a step's trace, it is traced again with sizes of 1 specialised, as eager has them (not
    from the start: a chain CRF's step, which closes over a size, then failed to decompose)."""
    config = getattr(getattr(torch.fx.experimental, "_config", None), "backed_size_oblivious", None)
    if config is None:
        return contextlib.nullcontext()
    return torch.fx.experimental._config.patch(backed_size_oblivious=False)


def _changed(text: str) -> str:
    """torch's "pair[0] differ in 'shape: torch.Size([2, 3]) vs torch.Size([1, 2, 3])', ..." as "changes (...)"."""
    found = re.search(r"pair\[(\d+)\] differ in '([^']*)'", text)
    return f"changes ({found.group(2)}, carry {found.group(1)})" if found else "changes its shape or dtype"


def _take_as_where(site, branches: set, swaps: contextlib.ExitStack) -> str:
    """The branch at ``site`` taken as ``torch.where`` from the next trace on; "" when it is, else why not."""
    filename, line, function = site
    if function == "__oc_step":  # the loop's own body: the step is compiled again with that if as where
        if line in branches:
            return f"; taken as torch.where, line {line} still stopped the trace"
        branches.add(line)
        return ""
    why = swaps.enter_context(value_branches.chosen_by_where(filename, line, function))
    return "" if why is None else f"; not as torch.where: {why}"


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]*)\n\s*([^\n]*)')


def _user_frames(text: str):
    return _USER_FRAME.findall(text.split("from user code:", 1)[-1])


def _value_branch(error: Exception) -> Optional[Tuple[str, int, str]]:
    """(file, line, function) of the ``if`` a step's trace stopped at on a tensor's value, else None."""
    text = str(error)
    if _GRAPH_BREAK not in text or "data-dependent branching" not in text.lower():
        return None
    frames = _user_frames(text)
    return (frames[-1][0], int(frames[-1][1]), frames[-1][2].strip()) if frames else None


def _step_failure(error: Exception) -> str:
    """Why the step did not trace, said at the model's line: a graph break (``UncapturedHigherOrderOpError``)
    names its kind on the line after "Got graph break/error:" and its place last under "from user code:"; a
    branch on a tensor's value that could not be taken as ``torch.where`` gets the branchless form that a scan
    step can hold."""
    text = str(error).strip()
    first = text.splitlines()[0][:300] if text else ""
    if _GRAPH_BREAK not in text:
        return f"{type(error).__name__}: {first}"
    kind = next((line.strip() for line in text.split(_GRAPH_BREAK, 1)[1].splitlines() if line.strip()),
                "a graph break")
    frames = _user_frames(text)
    where = f" at {frames[-1][0]}:{frames[-1][1]} ({frames[-1][3].strip()})" if frames else ""
    said = f"{kind}{where}"
    if "data-dependent branching" in kind.lower():
        said += (": a step cannot branch on a tensor's value; compute both sides and choose with "
                 "torch.where(cond, a, b) (e.g. m = torch.where(torch.all(n == 0), i, torch.maximum(i, f))), "
                 "or use torch.cond")
    return said


_MODULE_WRITES = ("__setattr__", "register_buffer", "register_parameter")


def _state_kept_on_a_module(frames) -> str:
    """A step that assigns a tensor to a module's attribute (snntorch's neurons keep their membrane potential as
    ``self.mem``, updated every step) changes something outside the step, which a scan step may not (torch: "HOP:
    Unsafe side effect", or export's buffer-assignment hook "marked as skipped"): said at the assignment in the
    model's or library's code, with what a step can do instead. "" when the failure is another."""
    inside = [k for k, f in enumerate(frames) if f[2].strip() in _MODULE_WRITES and f[0].endswith("module.py")]
    if not inside or inside[0] == 0:
        return ""
    filename, line, _, code = frames[inside[0] - 1]
    return (f"the step keeps state on a module: {filename}:{line} ({code.strip()}) assigns a module attribute "
            f"every step, and a scan step may change nothing outside itself; it is carried where the first step "
            f"leaves a tensor there (or a tuple or list of tensors) and torch lets a step write modules; else "
            f"carry that state in the loop's variables (a stateless or functional form of the layer, its state "
            f"passed in and returned)")


def scanned_steps(step_with, gate, carries, steps_in):
    """The final state and every step's outputs (cut to a gated range's count). A state that changes its shape
    or dtype on the first step (``h`` made ``[B, H]`` before the loop, ``[1, B, H]`` by the step's broadcasting)
    is no scan's carry: that step runs before the scan, exactly as the loop's first iteration, and the scan
    carries the state it leaves over the rest. So does a step that keeps state on modules (``self.mem = ...``):
    what the first step wrote there is carried too (``module_state.py``)."""
    try:
        final, ys = scanned(lambda branches: _combine(step_with(branches), gate), carries, steps_in)
        return final, [y if gate is None else y[:gate.count] for y in ys]
    except CarryChanges as changed:
        if gate is not None:
            raise NotLiftable(f"its carried state {changed} on the first step, and its range starts past 0") from None
        kept = None
    except StateOnModules as refused:
        kept = module_state.kept_for(refused)
        if gate is not None or kept is None:
            raise
    first = torch.utils._pytree.tree_map(lambda s: s[0], steps_in)
    with kept.recording() if kept is not None else contextlib.nullcontext():
        carries, outs = _combine(step_with(frozenset()), None)(carries, first)
    own = len(carries)
    if kept is not None:
        carries, inner = carries + kept.values(), step_with
        step_with = lambda branches: kept.held(inner(branches), own)  # noqa: E731
    size = torch.utils._pytree.tree_leaves(steps_in)[0].shape[0]
    at = torch.arange(1, torch.sym_max(size, 2))
    rest = torch.utils._pytree.tree_map(lambda s: s.index_select(0, at.clamp(max=size - 1)), steps_in)
    gate = GatedSteps(rest, at < size, torch.sym_max(size - 1, 0))
    try:
        with module_state.buffer_hooks_aside(kept):
            final, ys = scanned(lambda branches: _combine(step_with(branches), gate), carries,
                                (rest, gate.valid))
    except CarryChanges as changed:
        raise NotLiftable(f"its carried state {changed} at every step, so no scan can carry it") from None
    if kept is not None:
        kept.leave(final[own:])
    return final[:own], [torch.cat([o.unsqueeze(0), y[:gate.count]]) for o, y in zip(outs, ys)]


def _stateless(combine):
    """``combine`` of a loop with no state, given one it passes through (torch's scan refuses no state at all:
    "scan() operator requires init leaves")."""
    def with_state(carry, x_t):
        _, outs = combine((), x_t)
        return (carry[0].clone(),), outs
    return with_state


def _combine(step, gate):
    """The scan's combine function: the step, its outputs fresh, a step past a gated range's end dropped."""
    def combine(carry, x_t):
        if gate is not None:
            x_t, valid = x_t
        new, outs = step(carry, x_t)
        new = _fresh(new)
        if gate is not None:  # a step past the range's end keeps the state as it was
            new = tuple(torch.where(valid, n, c) for n, c in zip(new, carry))
        return new, _fresh(outs)
    return combine


def _fresh(values) -> Tuple[torch.Tensor, ...]:
    """A scan's outputs may not alias its carry or inputs (a step returning ``h`` as both)."""
    for v in values:
        if not isinstance(v, torch.Tensor):
            raise NotLiftable(f"a step gives a {type(v).__name__}, not a tensor")
    return tuple(v.clone() for v in values)
