"""sherpa-onnx's NeMo transducer contract (issue #48, Deliver 3): RNN-T and TDT from a NeMo-shaped model.

The bundled models (``models/nemo_transducer.py``) keep NeMo's classes and attribute names (ConformerEncoder on
``[N, C, T]``, RNNTDecoder with ``blank_as_pad`` and its LSTM states, RNNTJoint with TDT's duration outputs).
``export_nemo_transducer`` writes them in one call, and sherpa-onnx's Python recognizer (``model_type=
"nemo_transducer"``, four utterances in one padded batch) and its native binary (routed by the encoder's
``model_type``) decode WAV files to exactly the tokens of PyTorch's greedy decode by sherpa-onnx's rules on
sherpa-onnx's features, with both exporters. Every bad input is one ``ContractError`` with nothing written.
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from onnx_compat.contracts import ContractError, frontends
from onnx_compat.contracts import sherpa_nemo_transducer as snt
from onnx_compat.contracts import sherpa_nemo_transducer_consumers as cons
from onnx_compat.models import nemo_transducer as nt
from onnx_compat.parts.nemo_transducer import NemoDecoder, NemoEncoder, NemoJoint, export_nemo_transducer, read_shapes


def _needs_sherpa():
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")


def _consumers_ran(report, least=7):
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:
        assert check["ok"] and check["utterances"] == 4 and min(check["tokens"]) >= least, \
            f"degenerate decode, nothing compared: {check}"
    return checks


@pytest.fixture(scope="module")
def rnnt_export(tmp_path_factory):
    _needs_sherpa()
    folder = tmp_path_factory.mktemp("nemo") / "rnnt"
    return folder, export_nemo_transducer(nt.rnnt(), str(folder), exporter="torchscript")


def _eager(model):
    """The model's modules as sherpa-onnx calls them, the decoder in NeMo's export mode (no start symbol added)."""
    shapes = read_shapes(model, None)
    model.decoder._prepare_for_export()
    return cons.NemoEager(NemoEncoder(model.encoder), NemoDecoder(model.decoder), NemoJoint(model.joint),
                          shapes.vocab_size, shapes.pred_rnn_layers, shapes.pred_hidden, shapes.durations)


def test_nemo_rnnt_decodes_in_sherpa_onnx_like_pytorch(rnnt_export):
    folder, report = rnnt_export
    assert sorted(os.listdir(folder)) == ["decoder.onnx", "encoder.onnx", "joiner.onnx", "tokens.txt"]
    assert report.metadata == {"vocab_size": "15", "subsampling_factor": "4", "normalize_type": "per_feature",
                               "pred_rnn_layers": "1", "pred_hidden": "32", "feat_dim": "80",
                               "model_type": "EncDecRNNTBPEModel"}
    assert report.model_type == "nemo_transducer"
    lines = (folder / "tokens.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 16 and lines[-1] == "<blk> 15" and lines[0] == "<unk> 0"
    joiner = onnx.load(str(folder / "joiner.onnx"))
    assert joiner.graph.output[0].type.tensor_type.shape.dim[-1].dim_value == 16  # static: sherpa-onnx reads it
    _consumers_ran(report)


def test_nemo_tdt_decodes_in_sherpa_onnx_like_pytorch(tmp_path):
    """TDT (durations 0..4, 128 mel bins as parakeet-tdt, 2 LSTM layers), the decoder and joiner under dynamo."""
    _needs_sherpa()
    folder, model = tmp_path / "tdt", nt.tdt()
    report = export_nemo_transducer(model, str(folder),
                                    exporter={"encoder": "torchscript", "decoder": "dynamo", "joiner": "dynamo"})
    assert model.decoder._rnnt_export is False  # NeMo's export mode was on for the export only
    assert report.parts.graphs["decoder"].exporter == "dynamo"
    assert report.metadata["feat_dim"] == "128" and report.metadata["pred_rnn_layers"] == "2"
    assert "tdt" in report.metadata["url"] and report.metadata["durations"] == "0,1,2,3,4"
    joiner = onnx.load(str(folder / "joiner.onnx"))
    assert joiner.graph.output[0].type.tensor_type.shape.dim[-1].dim_value == 16 + 5
    _consumers_ran(report)


def test_the_reference_reads_the_durations_and_the_states():
    """PyTorch's TDT decode skips by the duration argmax (read as one frame each, other tokens); RNN-T's carries
    the prediction network's (h, c) (zeroed at every call, other tokens): the comparisons could see both."""
    pytest.importorskip("kaldi_native_fbank")
    samples = frontends.utterances((1.9,), seed=4)[0]
    tdt = _eager(nt.tdt())
    feats = cons.features(samples, 128, "per_feature")
    with torch.no_grad():
        out, lengths = tdt.encoder(torch.from_numpy(feats.T.copy())[None], torch.tensor([feats.shape[0]]))
        frames = out[0, :, :int(lengths[0])].T
        labels = cons.tdt_greedy(tdt, frames)
        one_each = replace(tdt, joiner=lambda f, g: _durations_one(tdt.joiner(f, g), tdt.vocab_size))
        assert len(labels) >= 10 and labels != cons.tdt_greedy(one_each, frames)
    rnnt = _eager(nt.rnnt())
    feats = cons.features(samples, 80, "per_feature")
    forgetful = replace(rnnt, decoder=lambda y, n, h, c: rnnt.decoder(y, n, torch.zeros_like(h), torch.zeros_like(c)))
    labels = cons.decode(rnnt, feats)
    assert len(labels) >= 20 and len(set(labels)) >= 8 and labels != cons.decode(forgetful, feats)


def _durations_one(logits, vocab_size):
    out = logits.clone().reshape(-1)
    out[vocab_size + 1:] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])
    return out.reshape(logits.shape)


def test_sherpa_front_end_measured_against_nemo(rnnt_export):
    """sherpa-onnx's NeMo transducer front end (Povey window, mel edge 7600 Hz, frames not centred) is not NeMo's
    (Hann, 8000 Hz, torch.stft centred): one frame fewer, features far apart, and PyTorch decodes other tokens from
    NeMo's -- so the reference decodes sherpa-onnx's features, and the report says how far they are."""
    front = rnnt_export[1].frontend
    assert front["frames (sherpa-onnx, NeMo)"] == [[127, 128], [190, 191]], front
    assert front["max_abs"] > 1.0 and front["mean_abs"] > 0.1, front
    assert front["utterances decoded differently from NeMo's features"] >= 1, front


def test_the_librosa_mel_banks_are_slaney():
    """NeMo's mel banks (librosa, Slaney): the mel scale linear to 1 kHz (mel 15) and logarithmic above, each
    triangle peaking at its centre (within one FFT bin) at most 2 / its width in Hz."""
    banks = nt.librosa_mel(16000, 512, 80)
    assert banks.shape == (80, 257) and (banks >= 0).all()
    assert np.allclose(nt._slaney_hz(nt._slaney_mel([500.0, 1000.0, 6000.0])), [500.0, 1000.0, 6000.0])
    assert nt._slaney_mel(1000.0) == pytest.approx(15.0)
    edges = nt._slaney_hz(np.linspace(0, nt._slaney_mel(8000.0), 82))
    freqs = np.linspace(0, 8000, 257)
    assert np.abs(freqs[banks.argmax(1)] - edges[1:-1]).max() <= 8000 / 256
    assert (banks.max(1) <= 2.0 / (edges[2:] - edges[:-2]) + 1e-6).all()


def _tdt_with_durations(durations):
    model = nt.tdt()
    model.cfg["model_defaults"]["tdt_durations"] = list(durations)
    return model


def _plain_embedding():
    model = nt.rnnt()
    model.decoder.prediction["embed"] = torch.nn.Embedding(15, 32)  # blank_as_pad=False: the blank, 15, has no row
    return model


def _wide_joint():
    model = nt.rnnt()
    model.joint.joint_net[-1] = torch.nn.Linear(48, 17)  # one output more than 15 tokens + blank
    return model


def _training():
    model = nt.rnnt()
    model.decoder.train()  # the container in eval mode, one part not
    return model


V = nt.vocabulary()


@pytest.mark.parametrize("model, kwargs, what, got", [
    (nt.rnnt, {"vocabulary": V}, "vocabulary", "15"),
    (nt.rnnt, {"vocabulary": ["<blk>"] + V}, "vocabulary blank", "at [0]"),
    (nt.rnnt, {"vocabulary": V[:-1] + ["<blk>", "<blk>"]}, "vocabulary blank", "at [14, 15]"),
    (nt.rnnt, {"durations": [0, 1]}, "durations", "2 [0, 1]"),
    (lambda: _tdt_with_durations([0, 1, 2, 4, 8]), {}, "durations", "[0, 1, 2, 4, 8]"),
    (nt.tdt, {"durations": []}, "durations", "0 []"),
    (_wide_joint, {}, "the joint's output width", "17"),
    (nt.rnnt, {"metadata": {"url": "parakeet-tdt-0.6b"}}, "encoder metadata 'url'", "'parakeet-tdt-0.6b'"),
    (nt.tdt, {"metadata": {"url": "parakeet-rnnt"}}, "encoder metadata 'url'", "'parakeet-rnnt'"),
    (nt.rnnt, {"metadata": {"normalize_type": "all_features"}},
     "encoder metadata 'normalize_type' (per-utterance feature normalisation)", "'all_features'"),
    (nt.rnnt, {"metadata": {"vocab_size": "16"}}, "encoder metadata 'vocab_size'", "'16'"),
    (nt.rnnt, {"metadata": {"feat_dim": "128"}}, "encoder metadata 'feat_dim'", "'128'"),
    (nt.rnnt, {"metadata": {"model_type": "conformer"}},
     "encoder metadata 'model_type' (routes sherpa-onnx-offline to its NeMo transducer loader)", "'conformer'"),
    (_plain_embedding, {}, "decoder on the blank (id 15: sherpa-onnx's first token) with zero states",
     "IndexError: index out of range in self"),
    (_training, {}, "model", "training mode (decoder)"),
    (lambda: torch.nn.Linear(2, 2), {}, "model", None),
])
def test_bad_inputs_are_refused_before_anything_runs(model, kwargs, what, got, tmp_path):
    """Each before any export, with nothing written."""
    with pytest.raises(ContractError) as err:
        export_nemo_transducer(model(), str(tmp_path / "model"), verify=False, **kwargs)
    found = {f.what: f.got for f in err.value.findings}
    assert what in found and (got is None or found[what] == got), err.value
    assert os.listdir(tmp_path) == []


def test_a_vocabulary_without_the_blank_says_to_append_it(tmp_path):
    with pytest.raises(ContractError) as err:
        export_nemo_transducer(nt.rnnt(), str(tmp_path / "model"), vocabulary=V, verify=False)
    assert err.value.findings[0].fix == "append '<blk>' to the joint's vocabulary", err.value


def test_the_graphs_are_checked_as_sherpa_onnx_loads_them(rnnt_export):
    """A joiner whose last dim is symbolic (sherpa-onnx reads the vocabulary size from it), and decoder inputs that
    are int64 (sherpa-onnx builds int32 tensors), are refused by the graph check that runs before writing."""
    folder, report = rnnt_export
    protos = {g: onnx.load(str(folder / f"{g}.onnx")) for g in snt.GRAPHS}
    shapes = read_shapes(nt.rnnt(), None)
    vocabulary = V + ["<blk>"]
    snt.check_graphs(protos, report.metadata, vocabulary, shapes)  # as written: it holds
    last = protos["joiner"].graph.output[0].type.tensor_type.shape.dim[-1]
    last.Clear()
    last.dim_param = "classes"
    protos["decoder"].graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    with pytest.raises(ContractError) as err:
        snt.check_graphs(protos, report.metadata, vocabulary, shapes)
    found = {f.what: f.got for f in err.value.findings}
    assert found.get("joiner output 0 (logits) 'outputs' dim 3 (V) of [N, T, U, V]") == "'classes'", err.value
    assert found.get("decoder input 0 (targets) 'targets' dtype") == "int64", err.value


def test_the_python_api_needs_model_type_nemo_transducer(rnnt_export):
    """``OfflineRecognizer.from_transducer``'s default ``model_type="transducer"`` sends the same files to the
    icefall loader, which ends on the decoder's metadata (sherpa-onnx issue #2226): why the report and the docs name
    ``model_type="nemo_transducer"``, which the consumer above passes."""
    from onnx_compat.contracts.consumers import ConsumerMismatch, run_child
    from onnx_compat.contracts.sherpa_runs import write_wavs
    folder, report = rnnt_export
    default = cons._SCRIPT.replace(',\n    model_type="nemo_transducer")', ')')
    assert default != cons._SCRIPT
    wavs = write_wavs(str(folder.parent), (0.5,), 16000, seed=4, stem="default")
    with pytest.raises(ConsumerMismatch) as err:
        run_child(default, [str(folder), "80", "16000", *wavs], "default model_type")
    assert "'vocab_size' does not exist in the metadata" in err.value.got, err.value
    assert run_child(cons._SCRIPT, [str(folder), "80", "16000", *wavs], "nemo_transducer").startswith("[[")


def test_the_bundled_nemo_front_end_is_nemos():
    """The bundled ``FilterbankFeatures`` (NeMo's front end, the side ``report.frontend`` measures sherpa-onnx's
    against) equals kaldi-native-fbank's own port of NeMo's (``OnlineNemoFbank``) on every frame that one emits:
    the log-mel values to 2e-4, before the normalisation. Povey / 7600 Hz (sherpa-onnx's transducer path) is far."""
    knf = pytest.importorskip("kaldi_native_fbank")
    if not hasattr(knf, "OnlineNemoFbank"):
        pytest.skip("this kaldi-native-fbank has no OnlineNemoFbank")
    samples = frontends.utterances((1.27,), seed=4)[0]
    bank = knf.OnlineNemoFbank(knf.NemoFbankOptions())
    bank.accept_waveform(16000, samples.tolist())
    bank.input_finished()
    theirs = np.asarray(bank.get_frames(0, bank.num_frames_ready)[0])
    ours, frames = nt.FilterbankFeatures(normalize="NA")(torch.from_numpy(samples)[None], torch.tensor([samples.size]))
    ours = ours[0].T.numpy()
    assert int(frames[0]) == 128 and theirs.shape == (127, 80)  # NeMo's last centred frame needs the whole tail
    assert np.abs(ours[:127] - theirs).max() < 2e-4
    sherpa = cons.features(samples, 80, "")
    assert np.abs(sherpa[:127] - theirs).mean() > 0.1
