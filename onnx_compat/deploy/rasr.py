"""RASR as a deployment step: ``export(..., rasr=True)``, ``rasr={...}`` or ``contract="rasr"``, one step.

RASR maps the model's names through its io-map; by default the features are
the first input, their lengths that input's lengths and the output the first
output, as the specs declare them (``rasr={...}``: ``check_rasr``'s keyword
arguments instead). The rules are the RASR contract's (``contracts/
rasr_contract.py``); a model RASR would refuse is one ``ContractError``
before anything is written. With ``verify`` the model also runs in the native
RASR-style consumer when it is built and the model takes lengths, as RASR
feeds them.
"""
from __future__ import annotations

from typing import Optional

from onnx_compat.contracts.rasr import check_rasr
from onnx_compat.deploy.contract import ContractStep


def rasr_names(inputs, outputs) -> dict:
    """RASR's io-map from the specs: the first input, its lengths (or none), the first output."""
    data, out = inputs[0], outputs[0]
    return {"features": data.name, "features_size": data.onnx_names[1] if data.lengths else None,
            "output": out.name}


class RasrStep(ContractStep):
    """``names``: ``check_rasr``'s keyword arguments (None: from the specs, ``rasr_names``)."""

    def __init__(self, names: Optional[dict] = None):
        super().__init__("rasr", options=names)
        self.check = None

    @property
    def needs_whole_graph(self) -> bool:
        """RASR's rules read only the graph's inputs and outputs; a built consumer loads the whole model."""
        return any(consumer.available() is None for consumer in self.contract.consumers)

    @property
    def contract(self):
        from onnx_compat.contracts import get_contract
        return get_contract(self.name)

    def before_capture(self, request) -> None:
        if self.options is None:
            self.options = rasr_names(request.subject.inputs, request.subject.outputs)
        super().before_capture(request)

    def before_write(self, request, report, proto) -> None:
        super().before_write(request, report, proto)  # refuses the model with every broken rule
        self.check = check_rasr(proto, **self.options)  # the roles it fits (reads the graph's I/O only)

    def in_consumers(self, proto, subject) -> None:
        """RASR's consumers feed the features' lengths: a model without that input is not run in them."""
        if self.options.get("features_size", "data:size1") is not None:
            return super().in_consumers(proto, subject)
        for consumer in self.contract.consumers:
            self.applied.consumer_checks.append({"consumer": consumer.name, "ok": None,
                                                 "skipped": "the model takes no features-size input, which it feeds"})

    def describe(self) -> dict:
        entry = {**super().describe(), **self.check.to_dict(), "names": dict(self.options)}
        entry["summary"] = ["rasr        ok, fits " + "/".join(self.check.roles()) + self._said()]
        return entry
