"""A streaming export under a consumer's contract (``export_streaming(contract=...)``): the declarations checked
before anything runs, the streamed graph checked and decoded inside the consumer before it is written.

Apart from ``api.py`` so the entry reads as steps and the contract's handling is read in one place; the
``contracts`` package is imported lazily, only when a contract is named.
"""
from __future__ import annotations

from typing import Optional

import onnx

from .probe import run_step


def declared_contract(name: Optional[str], d, vocabulary):
    """The streaming contract, its rules checked on the declarations (``ContractError`` before anything runs)."""
    if name is None:
        return None
    from onnx_compat.contracts.sherpa_streaming import check_declared, streaming_contract
    found = streaming_contract(name)
    check_declared(found, d.inputs, d.layout.flat, d.outputs, d.plan.time_axis, vocabulary)
    return found


def is_contract_error(exc: Exception) -> bool:
    """A contract's refusal or a consumer's different result: the user's error, not the exporter's."""
    from onnx_compat.contracts import ConsumerMismatch, ContractError
    return isinstance(exc, (ContractError, ConsumerMismatch))


def contracted(job, proto, tmp: str):
    """Before writing: the contract on the streamed graph (metadata set, saved to ``tmp``), then the stream decoded
    inside the contract's consumers against PyTorch's streamed decode."""
    from onnx_compat.contracts.sherpa_stream_consumers import StreamJob
    from onnx_compat.contracts.sherpa_streaming import apply_streaming
    d = job.declared
    applied = apply_streaming(job.contract, proto, d.layout.flat, d.plan.chunk, d.plan.shift, job.vocabulary,
                              job.contract_metadata)
    onnx.save(proto, tmp)
    initial = lambda b: d.layout.initial({**d.sizes, **({d.batch_dim: b} if d.batch_dim else {})},  # noqa: E731
                                         job.init_states, b)
    applied.verify_in_consumer(proto, StreamJob(job.step, d.inputs, d.outputs, initial, run_step), d.inputs)
    return applied


def contract_entry(applied) -> dict:
    """The report's entry for the contract, as ``export()``'s contract step writes it (``report.contract``)."""
    from onnx_compat.deploy.contract import ContractStep
    step = ContractStep(applied.contract.name, applied.vocabulary)
    step.applied = applied
    return step.describe()
