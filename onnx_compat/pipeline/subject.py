"""The model with its declared I/O and its example: built once, handed to every stage.

``export``, ``verify``, ``diagnose`` and the vanilla baseline all start the
same way: map the ONNX inputs onto the forward arguments, check the user's
examples, pick the export example, and wrap the model so exporters see flat
tensors. ``Subject.build`` does that once and checks everything it can before
any export runs, so bad input is one error naming the culprit.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from onnx_compat.errors import ArgumentTypeError, SpecError
from onnx_compat.model_state import preserved
from onnx_compat.patches.compiled import uncompiled
from onnx_compat.pipeline import random_draws
from onnx_compat.pipeline.adapter import IOAdapter, check_outputs, flatten
from onnx_compat.spec import TensorSpec, check_examples, example_inputs, forward_arguments, forward_parameters


def as_specs(specs, what: str) -> List[TensorSpec]:
    """One ``TensorSpec`` or a non-empty list of them, as a list."""
    specs = [specs] if isinstance(specs, TensorSpec) else list(specs or ())
    if not specs or not all(isinstance(s, TensorSpec) for s in specs):
        raise ArgumentTypeError(f"{what} must be a TensorSpec or a non-empty list of TensorSpec", argument=what,
                                value=specs)
    return specs


@dataclass
class Subject:
    """``model`` seen through its specs: what is exported and what its ONNX model is compared with.

    ``example``: the named dim sizes of the export example; ``args``: its tensors in ONNX order, a fresh
    copy at each access (a model that writes into its input, ``x *= 2``, must not change what the next
    call, the exporter or the user sees); ``examples``: the user's examples, checked; ``pairs``:
    ``(onnx_name, forward_arg)`` per input.
    """

    model: torch.nn.Module
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    pairs: List[Tuple[str, Optional[str]]]
    examples: List[Dict[str, torch.Tensor]]
    example: Dict[str, int]
    example_args: Tuple[torch.Tensor, ...]  # kept as drawn; read through ``args``
    seed: int = 0
    sizes: Optional[Mapping[str, int]] = None
    notes: List[str] = field(default_factory=list)  # what was inferred about the inputs (integer ranges)
    # the eager outputs ``check_outputs`` got on the export example when that is the user's first example, which
    # verification checks too: its reference, so the eager model does not run on it twice
    example_reference: Optional[list] = None
    draws: List[str] = field(default_factory=list)  # where the model draws random numbers ONNX nodes can draw

    @classmethod
    def build(cls, model: torch.nn.Module, inputs, outputs, *, examples=None,
              sizes: Optional[Mapping[str, int]] = None, seed: int = 0) -> "Subject":
        if not isinstance(model, torch.nn.Module):
            raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}", argument="model")
        inputs, outputs = as_specs(inputs, "inputs"), as_specs(outputs, "outputs")
        names = [n for s in inputs + outputs for n in s.onnx_names]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"ONNX names must be unique; {dupes} appear more than once")
        pairs = forward_arguments(model, inputs)
        if is_scripted(model):
            _check_scripted_order(model, pairs)
        checked = check_examples(inputs, examples)
        example, args = example_inputs(inputs, checked, sizes, seed)
        inputs, notes = _with_int_ranges(model, inputs, pairs, args)
        if notes:  # the generated inputs are drawn again, in the ranges found
            example, args = example_inputs(inputs, checked, sizes, seed)
        return cls(model, inputs, outputs, pairs, checked, dict(example), own_copies(args), seed, sizes, notes=notes)

    @property
    def args(self) -> Tuple[torch.Tensor, ...]:
        return own_copies(self.example_args)

    def adapter(self) -> torch.nn.Module:
        """The model with flat ONNX I/O, as exporters want it (its ``model`` is the user's). A ScriptModule is
        its own adapter: the TorchScript exporter exports its compiled graph as it is (loops and branches as
        ONNX ``Loop``/``If``), but cannot trace a Python module that calls one ("not part of the active
        trace"); its inputs are its forward's own, in order (``_check_scripted_order``), and the exporter
        flattens the tuples it returns."""
        if self.scripted:
            return self.model
        return IOAdapter(self.model, self.pairs, self.outputs)

    @property
    def scripted(self) -> bool:
        return is_scripted(self.model)

    def refused_exporter(self, name: str) -> Optional[str]:
        """Why exporter ``name`` cannot capture this model, or None. A ScriptModule is TorchScript's alone; one
        inside a Python module neither exporter can capture there (measured on torch 2.13: TorchScript's
        tracing "Tried to trace <...> but it is not part of the active trace", torch.export "State dict entry
        for parameter ... is not an instance of torch.nn.Parameter")."""
        inner = _scripted_submodule(self.model)
        if inner is not None:
            path, module = inner
            return (f"submodule {path!r} is a ScriptModule ({_scripted_kind(module)}) called from Python code, which "
                    f"neither exporter can capture (TorchScript's tracing cannot enter it, torch.export cannot "
                    f"read TorchScript code): export that ScriptModule itself, or the Python module it was "
                    f"compiled from in its place")
        if self.scripted and name == "dynamo":
            return (f"the model is a ScriptModule ({_scripted_kind(self.model)}), whose TorchScript code the dynamo "
                    f"exporter (torch.export) cannot capture; the TorchScript exporter exports it as it is")
        return None

    def check_outputs(self, repeatable: bool = True) -> None:
        """Run the model once on the example: the outputs it returns must be the declared ones
        (rank, dtype, static sizes, lengths); dims declared ``None`` are filled in from it. ``repeatable``:
        a model that drew random numbers must give the same outputs again, or draw only what ONNX random
        nodes draw (``random_draws.py``): then ``draws`` names where, and verification feeds eager's draws to
        the graph (no first-example reference is kept: it is recorded with its draws)."""
        state = random_draws.generator_state()
        returned = self._run_example()
        self.outputs = check_outputs(returned, self.outputs, self.example)
        if repeatable and not torch.equal(state, random_draws.generator_state()):
            self.draws = random_draws.check_repeatable(self._run_example, returned,
                                                       [n for s in self.outputs for n in s.onnx_names])
            if self.draws:
                self.notes.append(random_draws.drawing_note(self.draws))
        # the export example is the first user example (example_inputs); a drawing model's is recorded with its draws
        if self.examples and not self.sizes and not self.draws:
            self.example_reference = [t.detach().cpu().numpy() for t in returned]

    def _run_example(self) -> List[torch.Tensor]:
        # the plain model's numbers, as verification's reference; each run from the model as it was
        with preserved(self.model), torch.no_grad(), uncompiled():
            return flatten(self.adapter()(*self.args))

    @property
    def specs(self) -> List[TensorSpec]:
        return list(self.inputs) + list(self.outputs)


def is_scripted(model) -> bool:
    """A ``torch.jit.script``-ed, ``torch.jit.trace``-d or ``torch.jit.load``-ed module."""
    return isinstance(model, torch.jit.ScriptModule)


def _scripted_kind(model) -> str:
    if isinstance(model, torch.jit.TopLevelTracedModule):
        return "torch.jit.trace"
    return "torch.jit.script or torch.jit.load"


def _scripted_submodule(model) -> Optional[Tuple[str, torch.nn.Module]]:
    """The first ScriptModule inside a Python module (its path and itself); None when there is none, or when
    the model is a ScriptModule itself (its submodules are compiled with it)."""
    if is_scripted(model):
        return None
    return next(((path, m) for path, m in model.named_modules() if path and is_scripted(m)), None)


def _check_scripted_order(model, pairs) -> None:
    """A ScriptModule is exported as it is (``Subject.adapter``), its graph's inputs in its forward's order:
    inputs named after forward arguments must come in that order, from the first."""
    named = [arg for _, arg in pairs if arg is not None]
    order = list(forward_parameters(model))
    if named and named != order[:len(named)]:
        raise SpecError(f"the model is a ScriptModule, exported as it is, so its ONNX inputs are its forward's "
                        f"arguments in their order {order}; the inputs map to {named}: declare them in that order")


def own_copies(tensors):
    """Each tensor cloned: every eager call on the user's or generated inputs gets its own, so a model that
    writes into its input changes neither the inputs another run is fed nor the user's example."""
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in tensors)


def subject_of(model, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], **options) -> Subject:
    """A ``Subject`` passed as it is, or built from the model and its specs."""
    if isinstance(model, Subject):
        return model
    return Subject.build(model, inputs, outputs, **options)


def _with_int_ranges(model, inputs: List[TensorSpec], pairs, args) -> Tuple[List[TensorSpec], List[str]]:
    """Integer inputs without ``values=`` get the range of the table they index (``int_ranges``), so that
    generated inputs do not fail in ``F.embedding`` with an error that names neither input nor fix. When no
    range can be read off, the input keeps the default draws if the model runs on them; otherwise the
    ``IntRangeError`` naming the input and ``values=`` is the error."""
    from onnx_compat.int_ranges import IntRangeError, infer_int_ranges
    if all(s.values is not None or s.dtype.is_floating_point or s.dtype == torch.bool for s in inputs):
        return inputs, []
    with preserved(model), torch.no_grad():
        try:
            found = infer_int_ranges(model, inputs, own_copies(args))
        except IntRangeError as exc:
            try:
                flatten(IOAdapter(model, pairs, [])(*own_copies(args)))
            except Exception as failed:  # noqa: BLE001 - the default draws fail: the unknown range is why
                raise exc from failed
            return inputs, [f"{exc} (the default draws run, so they were kept)"]
    if not found.values:
        return inputs, list(found.notes)
    ranged = [dataclasses.replace(s, values=found.values[s.name]) if s.name in found.values else s for s in inputs]
    return ranged, list(found.notes)

