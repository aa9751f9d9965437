"""sherpa-onnx's transducer contracts on the multi-graph export (``export_parts``): offline and online ``lstm``.

The bundled stateless LSTM transducer (``models/transducer.py``) is split as icefall splits it for sherpa-onnx
(``models/sherpa_transducer.py``) and written as encoder.onnx, decoder.onnx, joiner.onnx and tokens.txt in one
``export_transducer`` call. sherpa-onnx's Python recognizer (four utterances in one batch) and its native binary
decode WAV files to exactly the labels of PyTorch's greedy decode through the same callables by sherpa-onnx's rule
(at most one label per frame, blank 0), with both exporters; online, the stream is cut as sherpa-onnx cuts it and
the LSTM's (h, c) are carried. Every bad input of issue #38 for these contracts is one ``ContractError`` with
nothing written.
"""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from onnx_compat import Dim, TensorSpec
from onnx_compat.contracts import ContractError, frontends
from onnx_compat.contracts.sherpa_transducer_consumers import Eager, kaldi_features, online_labels
from onnx_compat.parts.transducer import export_transducer
from onnx_compat.models import sherpa_transducer as st
from onnx_compat.streaming import StateSpec
from helpers import EXPORTERS

OFFLINE, ONLINE = "sherpa-onnx/offline-transducer", "sherpa-onnx/online-transducer-lstm"
CONFORMER = "sherpa-onnx/online-transducer-conformer"


def _consumers_ran(report, least=5):
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:
        assert check["ok"] and min(check["tokens"]) >= least, f"degenerate decode, nothing compared: {check}"
    return checks


def _needs_sherpa():
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_offline_transducer_decodes_in_sherpa_onnx_like_pytorch(exporter, tmp_path):
    _needs_sherpa()
    folder = tmp_path / "model"
    report = export_transducer(st.offline_parts(st.bundled()), str(folder), contract=OFFLINE,
                               vocabulary=st.vocabulary(), exporter=exporter)
    assert sorted(os.listdir(folder)) == ["decoder.onnx", "encoder.onnx", "joiner.onnx", "tokens.txt"]
    assert report.metadata["decoder"] == {"context_size": "2", "vocab_size": "10"}
    assert report.metadata["encoder"] == {"model_type": "conformer"}
    _consumers_ran(report)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_online_lstm_transducer_decodes_in_sherpa_onnx_like_pytorch(exporter, tmp_path):
    _needs_sherpa()
    parts, states = st.online_parts(st.bundled())
    report = export_transducer(parts, str(tmp_path / "model"), contract=ONLINE, vocabulary=st.vocabulary(),
                               states=states, exporter=exporter)
    assert report.metadata["encoder"] == {"model_type": "lstm", "num_encoder_layers": "1", "T": "16",
                                          "decode_chunk_len": "16", "rnn_hidden_size": "32", "d_model": "32"}
    for check in _consumers_ran(report):
        assert check["calls"][0] == 1 and min(check["calls"][1:]) >= 5, check  # one shorter than two chunks


def test_the_online_comparison_sees_the_states():
    """With (h, c) zeroed every call PyTorch's labels differ: sherpa-onnx's equal ones mean it carried them."""
    pytest.importorskip("kaldi_native_fbank")
    split = st.bundled()
    parts, states = st.online_parts(split)
    enc, dec, joi = (p.fn for p in parts)
    zeros = lambda: [s.initial({"batch": 1}) for s in states]  # noqa: E731
    carried = Eager(enc, dec, joi, 2, zeros, 16, 16)

    def forgetful(x, h, c):
        return enc(x, *zeros())
    features = kaldi_features(frontends.utterances((1.9,), seed=2)[0], 80)
    labels, calls = online_labels(carried, features)
    assert calls >= 10 and len(labels) >= 20
    assert labels != online_labels(replace(carried, encoder=forgetful), features)[0]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_online_conformer_transducer_decodes_in_sherpa_onnx_like_pytorch(exporter, tmp_path):
    """sherpa-onnx's online ``conformer`` type: the cache-aware Conformer encoder with its attention and convolution
    caches ([layers, frames, N, D], batch on axis 2) and the processed frame count sherpa-onnx feeds last."""
    _needs_sherpa()
    parts, states, shift = st.conformer_parts()
    report = export_transducer(parts, str(tmp_path / "model"), contract=CONFORMER, vocabulary=st.vocabulary(),
                               states=states, shift=shift, exporter=exporter)
    assert report.metadata["encoder"] == {"model_type": "conformer", "num_encoder_layers": "2", "T": "19",
                                          "decode_chunk_len": "16", "left_context": "8", "encoder_dim": "48",
                                          "pad_length": "3", "cnn_module_kernel": "5"}
    for check in _consumers_ran(report, least=4):
        assert check["calls"][0] == 1 and min(check["calls"][1:]) >= 4, check


def test_the_conformer_comparison_sees_the_caches_and_the_count():
    """Zeroed caches, or a processed count stuck at 0 (every cache slot masked), give other labels in PyTorch."""
    pytest.importorskip("kaldi_native_fbank")
    parts, states, shift = st.conformer_parts()
    enc, dec, joi = (p.fn for p in parts)
    zeros = lambda: [s.initial({"batch": 1}) for s in states[:2]]  # noqa: E731
    carried = Eager(enc, dec, joi, 2, zeros, 19, shift, processed=True)
    features = kaldi_features(frontends.utterances((1.9,), seed=2)[0], 80)
    labels, calls = online_labels(carried, features)
    assert calls >= 10 and len(labels) >= 15
    forgetful = replace(carried, encoder=lambda x, attn, conv, n: enc(x, *zeros(), n))
    stuck = replace(carried, encoder=lambda x, attn, conv, n: enc(x, attn, conv, torch.zeros_like(n)))
    assert labels != online_labels(forgetful, features)[0] and labels != online_labels(stuck, features)[0]


class _PlainDecoder(torch.nn.Module):
    """A prediction network with a plain embedding: -1 (sherpa-onnx's "no label yet") is out of range."""

    def __init__(self):
        super().__init__()
        self.embedding, self.out = torch.nn.Embedding(10, 32), torch.nn.Linear(64, 32)

    def forward(self, y):
        return self.out(self.embedding(y).flatten(1))


def _part(graph, **change):
    parts = {p.name: p for p in st.offline_parts(st.bundled())}
    parts[graph] = replace(parts[graph], **change)
    return list(parts.values())


N = Dim("batch")


@pytest.mark.parametrize("parts, kwargs, what, got", [
    (None, {"metadata": {"context_size": "3"}}, "decoder metadata 'context_size'", "'3'"),
    (None, {"vocabulary": st.vocabulary(9)}, "joiner vocabulary", "9"),
    (None, {"vocabulary": st.vocabulary()[1:] + ["<blk>"]}, "vocabulary blank", "at index 9"),
    (None, {"metadata": {"model_type": "transformer"}}, "encoder metadata 'model_type' (routes sherpa-onnx-offline "
     "to its icefall transducer loader)", "'transformer'"),
    (None, {"metadata": {"vocab_size": "11"}}, "decoder metadata 'vocab_size'", "'11'"),
    (_part("encoder", inputs=[TensorSpec("x", [N, 80, Dim("time")], lengths=[2], lengths_dtype=torch.int64)]), {},
     "encoder input 0 (features) 'x' dim 2 (C) of [N, T, C]", "Dim('time')"),
    (_part("decoder", inputs=[TensorSpec("y", [N, 2], torch.int64, values=(0, 10))]), {},
     "decoder input 'y' values", "(0, 10)"),
    (_part("decoder", fn=_PlainDecoder().eval()), {}, "decoder on the start context [-1, ..., -1, 0]",
     "IndexError: index out of range in self"),
    (_part("joiner", name="joint"), {}, "graphs", "['encoder', 'decoder', 'joint']"),
])
def test_offline_bad_inputs_are_refused_before_anything_runs(parts, kwargs, what, got, tmp_path):
    args = {"contract": OFFLINE, "vocabulary": st.vocabulary(), **kwargs}
    with pytest.raises(ContractError) as err:
        export_transducer(parts or st.offline_parts(st.bundled()), str(tmp_path / "model"), **args)
    found = {f.what: f.got for f in err.value.findings}
    assert found.get(what) == got, err.value
    assert os.listdir(tmp_path) == []


def test_online_states_in_the_wrong_layout_are_refused(tmp_path):
    """(h, c) batch first: sherpa-onnx stacks and builds them as [layers, N, hidden]."""
    parts, states = st.online_parts(st.bundled())
    batch_first = [StateSpec(s.name, [N, 1, 32]) for s in states]
    with pytest.raises(ContractError) as err:
        export_transducer(parts, str(tmp_path / "model"), contract=ONLINE, vocabulary=st.vocabulary(),
                          states=batch_first)
    assert "encoder input 1 (h) 'h' dim 0 (L) of [L, N, H]" in {f.what for f in err.value.findings}, err.value
    assert os.listdir(tmp_path) == []


def test_unknown_transducer_contract(tmp_path):
    """Refused before anything runs, listing every contract, export()'s and export_streaming()'s too."""
    from onnx_compat.errors import ArgumentError
    with pytest.raises(ArgumentError, match="'sherpa-onnx/nemo-ctc'.*offline-transducer"):
        export_transducer(st.offline_parts(st.bundled()), str(tmp_path / "m"), contract="sherpa-onnx/rnnt",
                          vocabulary=st.vocabulary())


def test_export_names_the_entry_point_of_a_multi_graph_contract(tmp_path):
    """export() writes one graph: asked for a transducer contract, it says which function writes three."""
    from onnx_compat import export
    split = st.bundled()
    encoder = st.offline_parts(split)[0]
    with pytest.raises(ContractError, match=r"export_transducer\(parts, folder"):
        export(split.model.encoder, str(tmp_path / "encoder.onnx"), encoder.inputs, encoder.outputs, contract=OFFLINE,
               vocabulary=st.vocabulary())
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change, what", [
    ({"inputs": [TensorSpec("x", [N, Dim("time"), 80])]}, "encoder input 'x' dim 1 (T)"),
    ({"states_in": ["h"], "states_out": ["h"]}, "encoder states"),
])
def test_online_encoder_declarations_are_refused(change, what, tmp_path):
    """sherpa-onnx feeds T frames and (h, c) exactly: a dynamic window or one state is refused before export."""
    parts, states = st.online_parts(st.bundled())
    parts[0] = replace(parts[0], **change)
    with pytest.raises(ContractError) as err:
        export_transducer(parts, str(tmp_path / "model"), contract=ONLINE, vocabulary=st.vocabulary(), states=states)
    assert what in {f.what for f in err.value.findings}, err.value
    assert os.listdir(tmp_path) == []


def test_encoder_lengths_past_its_frames_are_refused_before_writing(tmp_path):
    """sherpa-onnx decodes as many frames as the encoder's lengths say: more than it has is refused (by the
    export's own check of lengths against their axis), nothing written."""
    from onnx_compat.errors import OnnxCompatError
    split = st.bundled()
    parts = st.offline_parts(split)

    def longer(x, lengths):
        out, n = split.encoder(x, lengths)
        return out, n + 5
    parts[0] = replace(parts[0], fn=longer, module=split)
    with pytest.raises(OnnxCompatError, match=r"'encoder_out:size1': lengths .* do not fit dim 1 of 'encoder_out'"):
        export_transducer(parts, str(tmp_path / "model"), contract=OFFLINE, vocabulary=st.vocabulary(),
                          exporter="torchscript")
    assert os.listdir(tmp_path) == []


def test_what_the_context_size_check_prevents(tmp_path):
    """Written with a context_size the decoder does not have (what the contract refuses before writing),
    sherpa-onnx builds a decoder input of the wrong width and the recognizer process fails."""
    _needs_sherpa()
    import onnx
    from onnx_compat.contracts import ConsumerMismatch
    from onnx_compat.contracts.sherpa_transducer import OFFLINE_TRANSDUCER
    from onnx_compat.contracts.sherpa_transducer_consumers import OfflineTransducerPython
    from onnx_compat.parts.transducer import _eager
    parts, folder = st.offline_parts(st.bundled()), str(tmp_path / "model")
    export_transducer(parts, folder, contract=OFFLINE, vocabulary=st.vocabulary(), exporter="torchscript",
                      verify=False)
    path = os.path.join(folder, "decoder.onnx")
    proto = onnx.load(path)
    next(p for p in proto.metadata_props if p.key == "context_size").value = "3"
    onnx.save(proto, path)
    with pytest.raises(ConsumerMismatch, match="exit code"):
        OfflineTransducerPython().verify(folder, _eager(OFFLINE_TRANSDUCER, parts, (), None), st.vocabulary(), 80)


def test_conformer_encoder_without_the_processed_count_is_refused(tmp_path):
    """sherpa-onnx feeds the conformer encoder four inputs, the processed frame count last."""
    parts, states, shift = st.conformer_parts()
    parts[0] = replace(parts[0], states_in=["attn", "conv"])
    with pytest.raises(ContractError) as err:
        export_transducer(parts, str(tmp_path / "model"), contract=CONFORMER, vocabulary=st.vocabulary(),
                          states=states, shift=shift)
    assert "encoder states" in {f.what for f in err.value.findings}, err.value
    assert os.listdir(tmp_path) == []
