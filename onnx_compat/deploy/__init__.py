"""The deployment steps built into ``onnx_compat.export``, one file each, and the arguments that ask for them.

``export(rasr=..., contract=..., runtimes=..., quantize=...)`` is turned into
``Step`` objects here, once, above the pipeline (``pipeline/steps.py`` says
what a step is). A step's module loads only when its argument asks for it: an
export that names no consumer loads no consumer. A feature of its own (the
label scorers, a decoder's contract) is a ``Step`` subclass in its own file,
passed to ``export(steps=[...])``; the pipeline does not change.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Union

from onnx_compat.pipeline.steps import Step

__all__ = ["Step", "steps_for"]


def steps_for(*, rasr: Union[bool, dict] = False, contract: Optional[str] = None,
              vocabulary: Optional[Sequence[str]] = None, runtimes: Sequence = (), quantize: Optional[str] = None,
              quantize_options: Optional[Mapping[str, object]] = None, examples=None) -> List[Step]:
    """The steps ``export``'s deployment arguments ask for, in the order they run: RASR (``rasr=True`` and
    ``contract="rasr"`` are two spellings of the one RASR step), another consumer's contract, the extra
    runtimes, quantization (it writes the model, last)."""
    steps: List[Step] = []
    if rasr or contract == "rasr":
        from onnx_compat.deploy.rasr import RasrStep
        steps.append(RasrStep(rasr if isinstance(rasr, dict) else None))
    if contract is not None and contract != "rasr":
        from onnx_compat.deploy.contract import ContractStep
        steps.append(ContractStep(contract, vocabulary=vocabulary))
    if runtimes:
        from onnx_compat.deploy.runtimes import RuntimesStep
        steps.append(RuntimesStep(runtimes))
    if quantize or (quantize_options or {}).get("target") is not None:  # naming only a target asks for auto
        from onnx_compat.deploy.quantize import QuantizeStep
        steps.append(QuantizeStep(quantize or "auto", quantize_options, examples=examples))
    return steps
