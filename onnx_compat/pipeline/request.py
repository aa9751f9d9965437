"""The user's arguments to ``export()``, checked once, before anything runs.

Everything that can be wrong with the arguments (an unknown exporter, names
used twice, a folder that cannot take the file, weights past 2 GB without a
data file, an opset newer than the target runtime) is one clear error here,
before a minute of exporting is spent; each deployment step then checks
its own (``steps.py``). Every stage then reads the request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Mapping, Optional, Sequence

import torch

from onnx_compat.errors import ArgumentError, ArgumentTypeError, Culprit, TargetError
from onnx_compat.pipeline import capture, releases, weights
from onnx_compat.pipeline.files import check_room, check_writable
from onnx_compat.pipeline.steps import Step, checked
from onnx_compat.pipeline.subject import Subject

# The culprit search handed in from above (``diagnosis``): a failed attempt's error, the subject, the error's
# one-line form and the attempt's settings -> the module at fault, or None.
Diagnose = Callable[..., Optional[Culprit]]


@dataclass
class ExportRequest:
    """What to export, how, and where. ``subject``: the model with its specs and example."""

    subject: Subject
    path: str  # absolute, checked writable
    exporter: str  # "auto", "dynamo" or "torchscript"
    strategies: tuple  # capture strategies to try, in order
    verify: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    strict: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    opset: Optional[int] = None
    patches: Optional[dict] = None
    cleanup: Optional[bool] = None
    target: Optional[releases.Target] = None
    spill: bool = False  # the weights go to a data file beside the graph
    progress: Optional[Callable[[str], None]] = None  # told each stage as it starts (the CLI prints it)
    steps: List[Step] = field(default_factory=list)  # deployment steps run around the export (``steps.py``)
    diagnose: Optional[Diagnose] = None  # names the module at fault in a failed attempt; None: not searched

    def tell(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(stage)

    @property
    def model(self) -> torch.nn.Module:
        return self.subject.model

    @property
    def runtimes(self) -> list:
        """The other runtimes the steps want each attempt verified in (``Step.verify_in``)."""
        return [runtime for step in self.steps for runtime in step.verify_in]

    @property
    def needs_whole_graph(self) -> bool:
        return any(step.needs_whole_graph for step in self.steps)


def build_request(model: torch.nn.Module, path: str, inputs, outputs, *, exporter: str = "auto",
                  sizes: Optional[Mapping[str, int]] = None, examples=None, seed: int = 0,
                  target: Optional[str] = None, opset: Optional[int] = None,
                  external_data: Optional[bool] = None, metadata: Optional[Mapping[str, str]] = None,
                  steps: Sequence[Step] = (), **options) -> ExportRequest:
    """Check every argument and build the request; ``options`` are the ``ExportRequest`` fields as given.
    Each step then checks what it needs (``Step.before_capture``), before a minute of exporting."""
    subject = Subject.build(model, inputs, outputs, examples=examples, sizes=sizes, seed=seed)
    if exporter != "auto":
        capture.strategy(exporter)  # an unknown name is an ArgumentError naming the known ones
    check_patch_options(options.get("patches"))
    deploy = releases.parse_target(target) if target is not None else None
    if deploy is not None and opset is not None and opset > deploy.opset:
        raise TargetError(f"opset={opset} is newer than {deploy} implements")
    steps = checked(steps)
    written = check_writable(path)
    size = weights.weight_bytes(model)
    if external_data is False and size >= weights.PROTOBUF_LIMIT:
        raise ArgumentError(f"external_data=False: the weights ({size / 2**30:.2f} GiB) do not fit in one protobuf "
                            "(2 GB); leave external_data at None or True", argument="external_data", value=False)
    check_room(written, size)
    # weights from 1 GiB on stay in a data file beside the graph (weights.py), removed unless written
    spill = external_data if external_data is not None else size >= weights.IN_MEMORY_LIMIT
    request = ExportRequest(subject, written, exporter, _strategies(subject, exporter), target=deploy, opset=opset,
                            spill=bool(spill), metadata=dict(metadata or {}), steps=steps, **options)
    for step in steps:
        step.before_capture(request)
    return request


def check_patch_options(patches) -> None:
    """``patches=`` is ``patched()``'s keyword arguments: anything else (``patches=True``, a misspelt option, an
    unknown patch name) is refused here, before a capture, not as a TypeError from inside the first one."""
    if patches is None:
        return
    usage = "patches= takes patched()'s options as a dict, e.g. {'exclude': ['conv_padding']} or {'only': [...]}"
    if not isinstance(patches, Mapping):
        raise ArgumentTypeError(f"{usage}, not {type(patches).__name__} {patches!r}", argument="patches",
                                value=patches)
    from onnx_compat.patches.registry import patched
    try:
        patched(**patches)  # checks the options and the names; applies nothing
    except TypeError as exc:
        raise ArgumentTypeError(f"{usage}: {exc}", argument="patches", value=patches) from None


def _strategies(subject: Subject, exporter: str) -> tuple:
    """The capture strategies for ``exporter`` that can capture this model (``auto`` leaves out the others);
    an exporter named that cannot, or a model no exporter can capture, is refused here, saying why."""
    usable = tuple(s for s in capture.strategies_for(exporter) if not subject.refused_exporter(s.name))
    if not usable:
        why = subject.refused_exporter(exporter if exporter != "auto" else capture.EXPORTERS[0])
        works = [name for name in capture.EXPORTERS if not subject.refused_exporter(name)]
        advice = f"; use exporter={works[0]!r} or 'auto'" if works else ""
        raise ArgumentError(why + advice, argument="exporter" if exporter != "auto" else "model", value=exporter)
    return usable
