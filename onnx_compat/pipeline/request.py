"""The user's arguments to ``export()``, checked once, before anything runs.

Everything that can be wrong with the arguments (an unknown exporter, names
used twice, a folder that cannot take the file, weights past 2 GB without a
data file, an opset newer than the target runtime) is one clear error here,
before a minute of exporting is spent. Every stage then reads the request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from onnx_compat.errors import TargetError
from onnx_compat.pipeline import capture, releases, weights
from onnx_compat.pipeline.files import check_room, check_writable
from onnx_compat.pipeline.subject import Subject
from onnx_compat.runtimes import as_runtimes


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
    rasr: Union[bool, dict] = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    opset: Optional[int] = None
    patches: Optional[dict] = None
    cleanup: Optional[bool] = None
    target: Optional[releases.Target] = None
    runtimes: list = field(default_factory=list)
    spill: bool = False  # the weights go to a data file beside the graph
    progress: Optional[Callable[[str], None]] = None  # told each stage as it starts (the CLI prints it)
    contract: Optional[str] = None  # a consumer contract's name (``contracts/``), checked before exporting
    vocabulary: Optional[Sequence[str]] = None  # the contract's tokens, blank included
    quantize: Optional[str] = None  # a recipe (``quantization/``): the approximate model is what is written
    quantize_options: Mapping[str, object] = field(default_factory=dict)

    def tell(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(stage)

    @property
    def model(self) -> torch.nn.Module:
        return self.subject.model


def build_request(model: torch.nn.Module, path: str, inputs, outputs, *, exporter: str = "auto",
                  sizes: Optional[Mapping[str, int]] = None, examples=None, seed: int = 0,
                  target: Optional[str] = None, opset: Optional[int] = None, runtimes: Sequence = (),
                  external_data: Optional[bool] = None, metadata: Optional[Mapping[str, str]] = None,
                  **options) -> ExportRequest:
    """Check every argument and build the request; ``options`` are the ``ExportRequest`` fields as given."""
    subject = Subject.build(model, inputs, outputs, examples=examples, sizes=sizes, seed=seed)
    if exporter != "auto":
        capture.strategy(exporter)  # an unknown name is a ValueError naming the known ones
    deploy = releases.parse_target(target) if target is not None else None
    if deploy is not None and opset is not None and opset > deploy.opset:
        raise TargetError(f"opset={opset} is newer than {deploy} implements")
    others = as_runtimes(runtimes)
    written = check_writable(path)
    size = weights.weight_bytes(model)
    if external_data is False and size >= weights.PROTOBUF_LIMIT:
        raise ValueError(f"external_data=False: the weights ({size / 2**30:.2f} GiB) do not fit in one protobuf "
                         "(2 GB); leave external_data at None or True")
    check_room(written, size)
    # weights from 1 GiB on stay in a data file beside the graph (weights.py), removed unless written
    spill = external_data if external_data is not None else size >= weights.IN_MEMORY_LIMIT
    _check_deployment(subject, options, examples, bool(spill))
    return ExportRequest(subject, written, exporter, capture.strategies_for(exporter), target=deploy, opset=opset,
                         runtimes=others, spill=bool(spill), metadata=dict(metadata or {}),
                         **options)


def _check_deployment(subject: Subject, options: dict, examples, spill: bool) -> None:
    """A contract the specs cannot satisfy, or a quantization recipe, measure or calibration example that
    is wrong, is refused now: before a minute of exporting."""
    if options.get("contract"):
        from onnx_compat.contracts import check_specs
        check_specs(options["contract"], subject.inputs, subject.outputs)
    if options.get("quantize"):
        from onnx_compat.quantization import check_request
        if not options.get("verify", True):
            raise ValueError("quantize= writes a model proven against the float one: it needs verify=True")
        if spill:
            raise ValueError("quantize= needs the weights in memory; the export spills them (external_data)")
        check_request(options["quantize"], subject.inputs, subject.outputs, examples=examples,
                      **dict(options.get("quantize_options") or {}))

