"""``onnx_compat.export``: the public arguments turned into the pipeline's deployment steps, once.

The pipeline (``pipeline/``) exports, verifies and writes; what a deployment
adds -- RASR, a consumer's contract, other runtimes, quantization, a step of
the caller's own -- comes in as ``Step`` objects (``pipeline/steps.py``),
built here from the keyword arguments (``deploy/``). The culprit search of a
failed attempt (``diagnosis/``) is handed in the same way, so the pipeline
imports neither.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from onnx_compat import pipeline
from onnx_compat.deploy import steps_for
from onnx_compat.pipeline.report import Report
from onnx_compat.pipeline.steps import Step

__all__ = ["export"]


def export(model: torch.nn.Module, path: str, inputs, outputs, *, exporter: str = "auto",
           sizes: Optional[Mapping[str, int]] = None, verify: bool = True, atol: float = 1e-4, rtol: float = 1e-3,
           strict: bool = False, rasr: Union[bool, dict] = False, metadata: Optional[Mapping[str, str]] = None,
           opset: Optional[int] = None, seed: int = 0, patches: Optional[dict] = None,
           cleanup: Optional[bool] = None, examples=None, target: Optional[str] = None, runtimes=(),
           external_data: Optional[bool] = None, progress: Optional[Callable[[str], None]] = None,
           contract: Optional[str] = None, vocabulary: Optional[Sequence[str]] = None,
           quantize: Optional[str] = None, quantize_options: Optional[Mapping[str, object]] = None,
           steps: Sequence[Step] = ()) -> Report:
    """Export ``model`` to ``path`` and prove it; return the ``Report``.

    ``inputs``/``outputs``: ``TensorSpec`` lists in ONNX order. ``exporter``:
    "dynamo", "torchscript" or "auto" (TorchScript first, the cheaper
    export; dynamo when TorchScript fails to export or to verify). ``sizes`` overrides the example size of
    named dims. ``strict``: baked-constant TracerWarnings and degenerate
    outputs are errors. ``rasr``: True (or ``check_rasr`` keyword arguments)
    requires RASR's rules to hold (the RASR step; ``contract="rasr"`` is the same step). ``patches``: options
    for ``patched()``.
    ``cleanup``: clean the graph with ONNX Runtime's basic offline optimiser, then
    verify the result (default: TorchScript exports, and dynamo exports holding
    LSTM/GRU nodes; dynamo optimizes the rest of its graphs itself). ``examples``:
    real inputs ``[{onnx_name: tensor}, ...]``; the first is the export example
    unless ``sizes`` is given, and every one is verified besides the generated
    shapes. ``target``: the ONNX Runtime release the model must load in
    (``"onnxruntime==1.16"``): the newest opset it implements that the exporter
    writes, and its IR version (``releases.py``). ``runtimes``: other ONNX
    Runtimes to verify in as well (``verify``'s argument). ``external_data``: the
    weights in ``<path>.data`` beside the graph (default: from 1 GiB of weights
    on; past 2 GB it is a must). From 16 MiB of weights on they stay in a file during the export either
    way (``weights.ON_DISK_FROM``), which keeps its peak memory near the weights' size; ``report.peak_memory``
    has the export's own peak above the memory in use when it started (``memory.py``).
    ``progress``: called with the name of each stage as it starts (the CLI shows them on a terminal).
    ``contract``: a consumer's contract (``"sherpa-onnx/nemo-ctc"``, ``"rasr"``, ... see
    ``contracts/``): checked against the specs before exporting and against the graph before writing,
    its metadata and files (``tokens.txt`` from ``vocabulary``) written, and with ``verify`` the model
    run inside that consumer. ``quantize``: ``"auto"``, ``"int8-dynamic"``, ``"int8-static"``, ``"fp16"``,
    ... (see ``quantization/``): once the float model is proven, the approximate model verified with
    measures that fit it is written at ``path`` and the float model beside it (``model.float.onnx``);
    ``"auto"`` keeps the fastest recipe for the target runtime that meets every threshold and beats float.
    ``quantize_options``: its measures, thresholds, exclusion limit and ``target`` (naming only a target
    there asks for ``"auto"``). ``steps``: deployment steps of
    the caller's own (``pipeline.steps.Step``), run after the ones these arguments ask for.
    What each step did is ``report.steps[name]``.
    """
    planned = steps_for(rasr=rasr, contract=contract, vocabulary=vocabulary, runtimes=runtimes, quantize=quantize,
                        quantize_options=quantize_options, examples=examples) + list(steps or ())
    return pipeline.export(model, path, inputs, outputs, steps=planned, diagnose=culprit_of_failure,
                           exporter=exporter, sizes=sizes, verify=verify, atol=atol, rtol=rtol, strict=strict,
                           metadata=metadata, opset=opset, seed=seed, patches=patches, cleanup=cleanup,
                           examples=examples, target=target, external_data=external_data, progress=progress)


def culprit_of_failure(*args, **kwargs):
    """The diagnosis layer's culprit search (``diagnosis/of_export.py``), loaded when an attempt fails."""
    from onnx_compat.diagnosis.of_export import culprit_of_failure as search
    return search(*args, **kwargs)
