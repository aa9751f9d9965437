"""``export_transducer``: a transducer's encoder, decoder and joiner written as one sherpa-onnx model.

One call, one ``export_parts`` (the multi-graph export RASR's label scorers use too): the contract checks the
three parts' specs before anything runs, derives each graph's metadata from the specs and ``StateSpec``s (the
user's values on top, checked), exports and verifies each graph with ``export()``, checks the graphs against the
contract, decodes WAV files inside sherpa-onnx (Python and native) against PyTorch's greedy decode through the
same callables, and only then writes ``encoder.onnx``, ``decoder.onnx``, ``joiner.onnx`` and ``tokens.txt``.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence

import onnx

from onnx_compat.contracts.sherpa_transducer import (check_declared, check_graph_names, check_graphs, check_ports,
                                                     graph_metadata, tokens_text, transducer_contract)
from onnx_compat.contracts.sherpa_transducer_consumers import Eager


@dataclass
class TransducerReport:
    """What was written (``parts``: the ``PartsReport``), each graph's metadata, and what the consumers said."""

    parts: object
    contract: str
    metadata: Dict[str, Dict[str, str]]
    consumer_checks: List[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.contract, "metadata": self.metadata, "files": sorted(self.parts.files),
                "consumer_checks": self.consumer_checks}


def export_transducer(parts: Sequence, folder: str, *, contract: str, vocabulary: Sequence[str],
                      states: Sequence = (), shift: Optional[int] = None, exporter: str = "auto",
                      metadata: Optional[Mapping[str, str]] = None, verify: bool = True,
                      sizes: Optional[Mapping[str, int]] = None) -> TransducerReport:
    """Write ``parts`` (``Part``s named encoder, decoder, joiner) into ``folder`` as ``contract`` loads them.

    ``contract``: ``"sherpa-onnx/offline-transducer"``, ``"sherpa-onnx/online-transducer-lstm"`` (the encoder's
    ``states_in``/``states_out`` are ``h`` and ``c`` from ``states``) or ``"sherpa-onnx/online-transducer-conformer"``
    (its attention and convolution caches, then in ``states_in`` only the processed frame count); online, the
    encoder input's time dim is the ``T`` it is fed, and ``shift`` the frames advanced per call, ``T`` by default.
    ``metadata``: values for any graph's keys (``context_size``, ``model_type``, ...), routed to the graph that
    reads them. ``verify``: decode in each
    installed sherpa-onnx consumer before writing (one not installed is listed with the reason).
    """
    found = transducer_contract(contract)
    check_graph_names(found, parts)
    check_ports(found, parts, states)
    user = {k: str(v) for k, v in (metadata or {}).items()}
    meta = graph_metadata(found, parts, states, vocabulary, user, shift)
    check_declared(found, parts, vocabulary, meta, user)
    parts = [replace(p, metadata={**dict(p.metadata), **meta[p.name]}) for p in parts]
    checks: List[dict] = []

    def judge(protos: Mapping[str, onnx.ModelProto]) -> None:
        check_graphs(found, protos, vocabulary, meta)
        if verify:
            checks.extend(_in_consumers(found, protos, parts, states, vocabulary, shift))

    from onnx_compat.parts.export import export_parts
    report = export_parts(parts, folder, states, exporter=exporter, sizes=sizes, checks=[judge],
                          extra_files={"tokens.txt": tokens_text(vocabulary)})
    return TransducerReport(report, found.name, meta, checks)


def _eager(contract, parts, states, shift) -> Eager:
    by_name = {p.name: p for p in parts}
    context = by_name["decoder"].inputs[0].dims[1]
    if not contract.online:
        return Eager(by_name["encoder"].fn, by_name["decoder"].fn, by_name["joiner"].fn, context)
    table = {s.name: s for s in states}
    encoder = by_name["encoder"]
    frames = encoder.inputs[0].dims[1]
    return Eager(encoder.fn, by_name["decoder"].fn, by_name["joiner"].fn, context,
                 lambda: [table[s].initial({"batch": 1}) for s in encoder.states_out], frames,
                 shift if shift is not None else frames, contract.processed)


def _in_consumers(contract, protos, parts, states, vocabulary, shift) -> List[dict]:
    """The graphs as they will be written, in a temporary folder, decoded by each installed consumer."""
    eager = _eager(contract, parts, states, shift)
    bins = {p.name: p for p in parts}["encoder"].inputs[0].dims[2]
    out = []
    with tempfile.TemporaryDirectory(prefix="onnx_compat_sherpa_") as folder:
        for name, proto in protos.items():
            onnx.save(proto, os.path.join(folder, f"{name}.onnx"))
        with open(os.path.join(folder, "tokens.txt"), "w", encoding="utf-8") as fh:
            fh.write(tokens_text(vocabulary))
        for consumer in _consumers(contract):
            missing = consumer.available()
            if missing:
                out.append({"consumer": consumer.name, "ok": None, "skipped": missing})
                continue
            out.append(consumer.verify(folder, eager, list(vocabulary), bins))
    return out


def _consumers(contract):
    from onnx_compat.contracts import sherpa_transducer_consumers as c
    return (c.OnlineTransducerPython(), c.OnlineTransducerBinary()) if contract.online else \
        (c.OfflineTransducerPython(), c.OfflineTransducerBinary())
