"""A consumer's contract as a deployment step: ``export(..., contract="sherpa-onnx/nemo-ctc", vocabulary=...)``.

Before capture, the declared specs against the contract's ports; before
writing, the graph against the contract (its metadata set, its probes run)
and, with ``verify``, the model run inside each installed consumer; after
the model is written, the contract's files beside it (``tokens.txt``).
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

from onnx_compat.contracts import apply_contract, check_specs
from onnx_compat.pipeline.steps import Step


class ContractStep(Step):
    """The contract named ``contract`` (``contracts.CONTRACTS``); ``options``: the contract's own."""

    needs_whole_graph = True  # the consumers load the model from a file of their own

    def __init__(self, contract: str, vocabulary: Optional[Sequence[str]] = None,
                 options: Optional[Mapping[str, object]] = None):
        self.name = contract
        self.vocabulary = list(vocabulary) if vocabulary is not None else None
        self.options = dict(options) if options is not None else None
        self.applied = None  # ``contracts.Applied`` once the graph held

    def before_capture(self, request) -> None:
        check_specs(self.name, request.subject.inputs, request.subject.outputs)

    def before_write(self, request, report, proto) -> None:
        subject = request.subject
        self.applied = apply_contract(self.name, proto, subject.inputs, subject.outputs, vocabulary=self.vocabulary,
                                      metadata=request.metadata, options=self.options)
        if request.verify:
            self.in_consumers(proto, subject)

    def in_consumers(self, proto, subject) -> None:
        """The model run inside each of the contract's consumers that is installed."""
        self.applied.verify_in_consumer(proto, subject.model, subject.inputs)

    def write_files(self, request, report, folder: str) -> List[str]:
        return self.applied.write_files(folder) if self.applied is not None else []

    def describe(self) -> dict:
        entry = {"kind": "contract", **self.applied.to_dict()}
        files = ", ".join(entry.get("files") or [])
        entry["summary"] = [f"contract    {self.name}" + (f" (wrote {files})" if files else "") + self._said()]
        return entry

    def _said(self) -> str:
        """What each consumer said, on one line: ok, FAILED, or skipped with the reason."""
        checks = self.applied.consumer_checks
        said = "; ".join(f"{c.get('consumer')}: " + ("skipped, " + str(c["skipped"]) if c.get("ok") is None
                                                     else "ok" if c.get("ok") else "FAILED") for c in checks)
        return f"; {said}" if said else ""
