"""Deployment steps: what runs around an export without the pipeline knowing what it is.

RASR, a consumer's contract, the extra runtimes, quantization, the label
scorers: each is a ``Step`` handed to the pipeline in a list. The pipeline
calls the same few hooks on every step at fixed points and never branches
on which step it holds, so a new deployment feature is a new ``Step``
subclass in its own file (``onnx_compat/deploy/`` holds the built-in ones),
not a new branch in ``stages.py``:

- ``before_capture(request)``: the arguments and specs checked, before a
  minute of exporting is spent; raise to refuse (nothing is written).
- ``before_write(request, report, proto)``: the verified graph, after the
  pipeline set its metadata; change it (metadata) and check it (run it in a
  consumer); raise to refuse: nothing has been written yet.
- ``write_model(request, report, proto)``: only for the one step that
  ``writes_model`` -- it writes the model at ``request.path`` instead of the
  pipeline (quantization writes the approximate model there).
- ``write_files(request, report, folder)``: its own files beside the model,
  once the model is in place; returns their paths.
- ``describe()``: what it did, a JSON-able dict: ``report.steps[step.name]``.

Two properties a step declares instead of the pipeline testing for it:
``needs_whole_graph`` (it reads the whole model, so weights kept in a file
only to spare the export's memory come back into the graph) and
``verify_in`` (other runtimes each attempt's verification runs in too).

A step object holds what it found between its hooks: make a new one for
each export.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence

from onnx_compat.errors import ArgumentError

if TYPE_CHECKING:  # the hooks' argument types; the pipeline imports this module, not the reverse
    import onnx

    from onnx_compat.pipeline.report import Report
    from onnx_compat.pipeline.request import ExportRequest


class StepError(ArgumentError):
    """``steps=`` that cannot run together (two with one name, two that each write the model, not a ``Step``)."""

    def __init__(self, message: str):
        super().__init__(message, argument="steps")


class Step:
    """One deployment step; every hook does nothing unless a subclass says otherwise."""

    name: str = "step"  # its key in ``report.steps``; unique within one export
    needs_whole_graph: bool = False
    writes_model: bool = False

    @property
    def verify_in(self) -> Sequence[object]:
        """Other runtimes (``runtimes.Runtime``) each attempt is verified in besides this process's."""
        return ()

    def before_capture(self, request: "ExportRequest") -> None:
        """Check the arguments and specs before anything is exported."""

    def before_write(self, request: "ExportRequest", report: "Report", proto: "onnx.ModelProto") -> None:
        """Change and check the verified graph before anything is written."""

    def write_model(self, request: "ExportRequest", report: "Report", proto: "onnx.ModelProto") -> None:
        """Write the model at ``request.path`` (only called on a step that ``writes_model``), and set
        ``report.model_sha256`` to the hash (``files.content_hash``) of the proven float model's file."""
        raise NotImplementedError(f"step {self.name!r} says it writes the model but has no write_model")

    def write_files(self, request: "ExportRequest", report: "Report", folder: str) -> List[str]:
        """Write this step's own files into ``folder`` (the model's); return their paths."""
        return []

    def describe(self) -> Optional[dict]:
        """What the step did, for ``report.steps[self.name]`` (None: nothing to say)."""
        return {}


def checked(steps: Iterable[Step]) -> List[Step]:
    """The steps as a list, refused when two share a name or more than one writes the model."""
    steps = list(steps or ())
    for step in steps:
        if not isinstance(step, Step):
            raise StepError(f"steps: expected onnx_compat.pipeline.steps.Step objects, got {step!r}")
    names = [s.name for s in steps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StepError(f"steps: two steps named {twice[0]!r}; each step's name is its key in report.steps")
    writers = [s.name for s in steps if s.writes_model]
    if len(writers) > 1:
        raise StepError(f"steps: {writers} each write the model; only one step may")
    return steps


def model_writer(steps: Sequence[Step]) -> Optional[Step]:
    return next((s for s in steps if s.writes_model), None)
