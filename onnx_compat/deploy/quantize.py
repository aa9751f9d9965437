"""Quantization as a deployment step: ``export(..., quantize="int8-dynamic", quantize_options={...})``;
``quantize="auto"`` keeps the fastest recipe for the target runtime, among those that act on the model,
that meets every threshold, beats float by more than the timing margin and makes a smaller file
(``quantize_options={"target": ...}``, else the export's ``target=``, else CPU ONNX Runtime).

The recipe, its measures and calibration examples are checked before
capture; once the float model is proven, this step writes the model: the
approximate model, verified with measures that fit it, at the export's path
and the float model beside it (``model.float.onnx``); when quantization
fails neither is written (``quantization.finish_export``).
"""
from __future__ import annotations

from typing import Mapping, Optional

from onnx_compat.errors import ArgumentError
from onnx_compat.pipeline.files import content_hash
from onnx_compat.pipeline.steps import Step
from onnx_compat.quantization import check_request, finish_export


class QuantizeStep(Step):
    name = "quantization"
    needs_whole_graph = True  # ONNX Runtime's quantizer reads the whole model
    writes_model = True

    def __init__(self, recipe: str, options: Optional[Mapping[str, object]] = None, examples=None):
        self.recipe = recipe
        self.options = dict(options or {})
        self.examples = examples
        self.result: Optional[dict] = None

    def before_capture(self, request) -> None:
        if not request.verify:
            raise ArgumentError("quantize= writes a model proven against the float one: it needs verify=True",
                                argument="quantize", value=self.recipe)
        if request.spill:
            raise ArgumentError("quantize= needs the weights in memory; the export spills them (external_data)",
                                argument="quantize", value=self.recipe)
        subject = request.subject
        check_request(self.recipe, subject.inputs, subject.outputs, examples=self.examples,
                      **self._options(request))

    def write_model(self, request, report, proto) -> None:
        subject = request.subject
        request.tell(f"quantization ({self.recipe})")
        result = finish_export(proto, request.path, subject.model, subject.inputs, subject.outputs, report,
                               recipe=self.recipe, examples=subject.examples or None, **self._options(request))
        self.result = result.to_dict()
        report.model_sha256 = content_hash(result.float_path)  # the proven float model, beside the approximate one

    def _options(self, request) -> dict:
        """``quantize_options``; ``auto``'s target defaults to the export's own ``target=`` release."""
        options = dict(self.options)
        if options.get("target") is None and getattr(request, "target", None) is not None:
            options["target"] = f"{request.target.runtime}=={request.target.release}"
        return options

    def describe(self) -> dict:
        q = self.result
        lines = [f"quantized   {q.get('recipe')} -> {q.get('path')} (float model: {q.get('float_path')})"]
        if q.get("chosen_by"):
            from onnx_compat.quantization.report import tried_line
            lines += [f"            {q['chosen_by']}"] + [f"              {tried_line(t)}" for t in q["tried"]]
        return {**q, "summary": lines}
