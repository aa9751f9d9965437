"""Consumer contracts: what a runtime that loads our models assumes, checked and written at export time.

``export(..., contract="sherpa-onnx/nemo-ctc", vocabulary=[...])`` calls
``check_specs`` before exporting and ``apply_contract`` before writing; see
``docs/consumers.md``. Streaming and multi-graph consumers have their own entry points:
``export_streaming(..., contract="sherpa-onnx/online-nemo-ctc")`` and ``parts.transducer.export_transducer(parts,
folder, contract="sherpa-onnx/offline-transducer" | "sherpa-onnx/online-transducer-lstm" |
"sherpa-onnx/online-transducer-conformer")``. This package holds the
contracts and their consumers; what exports under a contract lives above it (``streaming/``, ``parts/``), so it
imports neither the streaming nor the multi-graph export.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from .base import Applied, Contract, ContractError, Finding
from .rasr_contract import RASR
from .consumers import ConsumerMismatch
from .names import refused
from .sherpa_onnx import NEMO_CTC, SPEAKER_EMBEDDING

CONTRACTS = (RASR, NEMO_CTC, SPEAKER_EMBEDDING)


def get_contract(name: str) -> Contract:
    """The single-graph contract ``name`` (``CONTRACTS``); any other name is refused by ``names.refused``."""
    for contract in CONTRACTS:
        if contract.name == name:
            return contract
    raise refused(name, "export")


def check_specs(name: str, inputs, outputs) -> Contract:
    """Before exporting: the declared specs can satisfy the contract (else one ``ContractError``)."""
    contract = get_contract(name)
    found = contract.check_specs(inputs, outputs)
    if found:
        raise ContractError(contract.name, found)
    return contract


def apply_contract(name: str, proto, inputs, outputs, *, vocabulary: Optional[Sequence[str]] = None,
                   metadata: Optional[Mapping[str, str]] = None, options: Optional[Mapping[str, object]] = None) -> Applied:
    """Before writing: check the graph against the contract, then set the contract's metadata on ``proto``.

    ``metadata``: the user's values (they win over derived ones and are checked like them). Returns the
    ``Applied`` contract (``files`` to write beside the model, ``notes``, ``to_dict()`` for the report,
    ``verify_in_consumer``); raises ``ContractError`` listing every finding, with ``proto`` unchanged.
    """
    from ..graph import set_metadata
    contract = check_specs(name, inputs, outputs)
    applied = contract.check(proto, vocabulary, metadata, options)
    set_metadata(proto, applied.metadata)
    return applied


__all__ = ["CONTRACTS", "Applied", "Contract", "ContractError", "ConsumerMismatch", "Finding", "apply_contract",
           "check_specs", "get_contract"]
