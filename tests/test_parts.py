"""export_parts: several graphs sharing StateSpecs, each through export(), checked against each other.

The bundled LSTM transducer is the subject: its prediction network's (h, c)
are [layers, B, P] in PyTorch and must come out batch-first in every graph,
its initializer (no inputs) is a constant graph, and a greedy decode run
through the written graphs in ONNX Runtime must equal the model's own.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

from onnx_compat import Dim, TensorSpec
from onnx_compat.models import transducer
from onnx_compat.parts import GraphContractError, Part, export_parts
from onnx_compat.runtimes.session import open_session
from onnx_compat.streaming import StateSpec


def _parts(model, ignore_token=False):
    hyps, V, E = Dim("hyps"), model.vocab, model.encoder.lstm.hidden_size
    L, P = model.layers, model.pred_dim
    states = [StateSpec("h", [L, hyps, P]), StateSpec("c", [L, hyps, P]), StateSpec("out", [hyps, P])]
    feat = transducer.feature_spec()
    token = TensorSpec("token", [hyps], torch.int32, values=(0, V))

    def update(tok, h, c):
        return model.predict(torch.zeros_like(tok) if ignore_token else tok, h, c)

    parts = [
        Part("encoder", model.encode, [feat], [TensorSpec("enc", [Dim("batch"), Dim("time"), E], lengths=[1])]),
        Part("init", lambda: model.initial_states(), states_out=["h", "c", "out"], module=model, state_batch=1),
        Part("update", update, [token], states_in=["h", "c"], states_out=["h", "c", "out"], module=model),
        Part("joint", lambda f, out: model.score(f.expand(out.shape[0], -1), out), [TensorSpec("frame", [1, E])],
             [TensorSpec("logp", [hyps, V])], states_in=["out"], module=model),
    ]
    return parts, states


def _io(proto):
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(proto.graph.input) + list(proto.graph.output)}


def _greedy_ort(folder, features, blank, max_symbols=3):
    s = {n: open_session(os.path.join(folder, f"{n}.onnx"))
         for n in ("encoder", "init", "update", "joint")}
    enc, _ = s["encoder"].run(None, {"features": features, "features:size1": np.array([features.shape[1]], np.int32)})
    h, c, out = s["init"].run(None, {})
    labels, t, emitted = [], 0, 0
    while t < enc.shape[1]:
        best = int(s["joint"].run(None, {"frame": enc[:, t], "out": out})[0].argmax(-1)[0])
        if best == blank or emitted >= max_symbols:
            t, emitted = t + 1, 0
            continue
        labels.append(best)
        h, c, out = s["update"].run(None, {"token": np.array([best], np.int32), "h_in": h, "c_in": c})
        emitted += 1
    return labels


def test_transducer_graphs_batch_first_and_decode_like_pytorch(tmp_path):
    model, _ = transducer.tiny()
    parts, states = _parts(model)
    folder = str(tmp_path / "rnnt")
    report = export_parts(parts, folder, states, batch="hyps", batch_first=True, exporter="torchscript")
    assert sorted(report.files) == ["encoder", "init", "joint", "update"] and report.constant == ["init"]
    io = {name: _io(onnx.load(path)) for name, path in report.files.items()}
    L, P = model.layers, model.pred_dim
    assert io["init"] == {"h": [1, L, P], "c": [1, L, P], "out": [1, P]}  # batch first, static 1
    assert io["update"]["h_in"] == ["hyps", L, P] and io["update"]["h_out"] == ["hyps", L, P]
    assert io["joint"]["out"] == ["hyps", P] and io["joint"]["frame"] == [1, model.encoder.lstm.hidden_size]
    assert {v["graph"] for v in report.states["h"]} == {"init", "update"}
    for T in (1, 9, 61):  # one frame; the export's example is 37
        x = torch.randn(1, T, 20, generator=torch.Generator().manual_seed(T))
        want = model.greedy_decode(x)
        assert _greedy_ort(folder, x.numpy(), model.blank) == want, T
        if T == 61:
            assert len(set(want)) >= 3, want  # varied labels, not one repeated: a decode that proves something


def test_an_ignored_token_names_the_graph_and_writes_nothing(tmp_path):
    model, _ = transducer.tiny()
    parts, states = _parts(model, ignore_token=True)
    with pytest.raises(GraphContractError) as info:
        export_parts(parts, str(tmp_path / "x"), states, batch="hyps", batch_first=True, exporter="torchscript")
    assert (info.value.graph, info.value.tensor, info.value.rule) == ("update", "token", "every input is used")
    assert os.listdir(tmp_path) == []


def test_a_state_without_the_batch_dim_is_refused(tmp_path):
    model, _ = transducer.tiny()
    parts, states = _parts(model)
    states[2] = StateSpec("out", [1, model.pred_dim])
    with pytest.raises(GraphContractError) as info:
        export_parts(parts, str(tmp_path / "x"), states, batch="hyps", batch_first=True)
    assert info.value.tensor == "out" and "batch" in str(info.value)
    assert os.listdir(tmp_path) == []
