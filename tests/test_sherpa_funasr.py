"""sherpa-onnx's FunASR contracts (issue #48 item 2): SenseVoice and Paraformer, offline.

Small models of FunASR's structure (``models/funasr_models.py``: the state dicts load into FunASR 1.4.16's own
classes, which compute the same outputs -- checked in a scratch environment) export in one call with their
``frontend_conf``, their ``am.mvn`` and their tokens, and sherpa-onnx -- Python binding (one padded batch) and
native binary -- decodes WAV files with them to exactly the tokens of PyTorch's decode on sherpa-onnx's own
features, with both exporters. Each bad input is one error with nothing written.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from onnx_compat.contracts import ConsumerMismatch, ContractError
from onnx_compat.contracts import sherpa_funasr as sf
from onnx_compat.contracts.sherpa_funasr_consumers import FunAsrPython, FunAsrRun, sense_voice_ids
from onnx_compat.models import funasr_models as fm
from onnx_compat.parts.funasr import ParaformerGraph, export_paraformer, export_sense_voice


def _needs_sherpa():
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")


def _consumers_ran(report, least=5):
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:  # a decode with few tokens, or one token over and over, compares little
        assert check["ok"] and min(check["tokens"]) >= least and min(check["distinct"]) >= 3, check
    return checks


@pytest.fixture(scope="module")
def sense_voice_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sense_voice")
    return fm.sense_voice_small(), fm.write_am_mvn(str(folder / "am.mvn"), *fm.cmvn_stats(560))


@pytest.fixture(scope="module")
def sense_voice(sense_voice_files, tmp_path_factory):
    """SenseVoiceSmall written with TorchScript, proven in both consumers with English and no ITN."""
    _needs_sherpa()
    model, mvn = sense_voice_files
    out = tmp_path_factory.mktemp("written") / "sense-voice"
    report = export_sense_voice(model, out, tokens=fm.sense_voice_tokens(), frontend_conf=fm.frontend_conf(),
                                cmvn=mvn, language="en", exporter="torchscript")
    return report, out


def test_sense_voice_decodes_in_sherpa_onnx_like_pytorch(sense_voice):
    report, out = sense_voice
    assert sorted(os.listdir(out)) == ["model.onnx", "tokens.txt"]
    _consumers_ran(report)
    meta = report.metadata
    assert {k: meta[k] for k in ("vocab_size", "blank_id", "lfr_window_size", "lfr_window_shift", "normalize_samples",
                                 "with_itn", "without_itn", "lang_auto", "lang_zh", "lang_en", "lang_ja", "lang_ko",
                                 "lang_yue")} == {
        "vocab_size": "48", "blank_id": "0", "lfr_window_size": "7", "lfr_window_shift": "6",
        "normalize_samples": "0", "with_itn": "14", "without_itn": "15", "lang_auto": "0", "lang_zh": "3",
        "lang_en": "4", "lang_ja": "11", "lang_ko": "12", "lang_yue": "7"}
    neg_mean, inv_stddev = fm.cmvn_stats(560)
    assert np.allclose([float(v) for v in meta["neg_mean"].split(",")], neg_mean, rtol=1e-6)
    assert np.allclose([float(v) for v in meta["inv_stddev"].split(",")], inv_stddev, rtol=1e-6)
    assert "dither" in report.notes[0]
    lines = (out / "tokens.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "<unk> 0" and lines[13] == "▁the 13" and len(lines) == 48


def test_sense_voice_comparison_sees_the_language_and_the_cmvn(sense_voice, sense_voice_files):
    """PyTorch's tokens with another language or without the CMVN differ from what sherpa-onnx decoded (so each
    reached it); a reference with the wrong language is a ConsumerMismatch."""
    report, out = sense_voice
    model, _ = sense_voice_files
    front = sf.FrontEnd(80, 7, 6, report.metadata["neg_mean"], report.metadata["inv_stddev"])
    english = report.consumer_checks[0]["ids"]
    chinese = FunAsrRun("sense-voice", sense_voice_ids(model, 3, 15, 0), front, fm.sense_voice_tokens())
    assert chinese.reference() != english
    zeros = ",".join(["0"] * 560)
    raw = FunAsrRun("sense-voice", sense_voice_ids(model, 4, 15, 0), sf.FrontEnd(80, 7, 6, zeros, zeros.replace(
        "0", "1")), fm.sense_voice_tokens())
    assert raw.reference() != english
    with pytest.raises(ConsumerMismatch):
        FunAsrPython().verify(str(out), FunAsrRun("sense-voice", sense_voice_ids(model, 3, 15, 0), front,
                                                  fm.sense_voice_tokens(), "en"))


def test_sense_voice_with_dynamo_auto_language_and_itn(sense_voice_files, tmp_path):
    _needs_sherpa()
    model, mvn = sense_voice_files
    report = export_sense_voice(model, tmp_path / "m", tokens=fm.sense_voice_tokens(),
                                frontend_conf=fm.frontend_conf(), cmvn=mvn, use_itn=True, exporter="dynamo")
    assert report.parts.graphs["model"].exporter == "dynamo" and report.language == "auto"
    _consumers_ran(report)


def test_lfr_stacks_frames_as_funasr_and_sherpa_onnx_do():
    """``1 + (T - 1) // n`` frames; frame i stacks input frames ``i*n - (m-1)//2 ..`` clamped to the ends
    (copies of the first frame in front, the last repeated past the end)."""
    x = np.arange(11, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    out = sf.apply_lfr(x, 7, 6)
    assert out.shape == (2, 14)
    assert out[0, ::2].tolist() == [0, 0, 0, 0, 1, 2, 3] and out[1, ::2].tolist() == [3, 4, 5, 6, 7, 8, 9]
    assert sf.apply_lfr(x[:7], 7, 6)[1, ::2].tolist() == [3, 4, 5, 6, 6, 6, 6]


def test_am_mvn_is_read_as_funasr_reads_it(tmp_path):
    """FunASR's am.mvn layout (Kaldi nnet1 text): the vector on the ``<LearnRateCoef>`` line after ``<AddShift>``
    and ``<Rescale>``, ``split()[3:-1]``."""
    path = tmp_path / "am.mvn"
    path.write_text("<Nnet>\n<Splice> 2 2\n[ 0 ]\n<AddShift> 2 2\n<LearnRateCoef> 0 [ -8.3 -9.25 ]\n"
                    "<Rescale> 2 2\n<LearnRateCoef> 0 [ 0.25 0.5 ]\n</Nnet>\n")
    assert sf.read_am_mvn(str(path)) == ([-8.3, -9.25], [0.25, 0.5])
    path.write_text("<Nnet>\n<AddShift> 2 2\n<LearnRateCoef> 0 [ -8.3 -9.25 ]\n</Nnet>\n")
    with pytest.raises(ContractError) as caught:
        sf.read_am_mvn(str(path))
    assert "no <Rescale>" in caught.value.got


def _refused(out, **kwargs):
    model = kwargs.pop("model", None) or fm.sense_voice_small()
    args = dict(tokens=fm.sense_voice_tokens(), frontend_conf=fm.frontend_conf(), cmvn=fm.cmvn_stats(560),
                exporter="torchscript")
    with pytest.raises(ContractError) as caught:
        export_sense_voice(model, out, **{**args, **kwargs})
    assert not os.path.exists(out), "nothing is written"
    return caught.value


@pytest.mark.parametrize("language", ["fr", "nospeech"])
def test_sense_voice_refuses_a_language_sherpa_onnx_cannot_select(tmp_path, language):
    error = _refused(tmp_path / "m", language=language)
    assert error.what == "language" and "'auto', 'zh', 'en', 'ja', 'ko', 'yue'" in error.expected


def test_sense_voice_refuses_a_model_lacking_a_language_sherpa_onnx_reads(tmp_path):
    lid = {k: v for k, v in fm.LID_DICT.items() if k != "ko"}
    error = _refused(tmp_path / "m", model=fm.sense_voice_small(lid_dict=lid))
    assert error.what == "model lid_dict" and "no ['ko']" in error.got


def test_sense_voice_refuses_a_vocabulary_that_disagrees_with_the_logits(tmp_path):
    error = _refused(tmp_path / "m", tokens=fm.sense_voice_tokens(47))
    assert error.what == "vocabulary" and error.got == "47"


def test_sense_voice_refuses_a_cmvn_of_the_wrong_size(tmp_path):
    mvn = fm.write_am_mvn(str(tmp_path / "am.mvn"), *fm.cmvn_stats(80))  # the fbank's bins, not n_mels x lfr_m
    error = _refused(tmp_path / "m", cmvn=mvn)
    assert error.what.endswith("neg_mean") and error.got == "80" and "560" in error.expected


@pytest.mark.parametrize("conf, what", [({"window": "hann"}, "frontend_conf 'window'"),
                                        ({"lfr_m": 5}, "input 0 dim 2"),
                                        ({"snip_edges": False}, "frontend_conf 'snip_edges'")])
def test_sense_voice_refuses_a_front_end_sherpa_onnx_does_not_compute(tmp_path, conf, what):
    cmvn = fm.cmvn_stats(80 * conf.get("lfr_m", 7))
    error = _refused(tmp_path / "m", frontend_conf=fm.frontend_conf(**conf), cmvn=cmvn)
    assert error.what == what, error


@pytest.mark.parametrize("metadata, what", [({"comment": "FunASR Nano"}, "metadata 'comment'"),
                                            ({"lang_en": "99"}, "metadata 'lang_en'"),
                                            ({"lfr_window_shift": "5"}, "metadata 'lfr_window_shift'"),
                                            ({"vocab_size": "True"}, "metadata 'vocab_size'")])
def test_sense_voice_refuses_metadata_sherpa_onnx_would_misread(tmp_path, metadata, what):
    error = _refused(tmp_path / "m", metadata=metadata)
    assert error.what.startswith(what), error


# --- Paraformer ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paraformer_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paraformer")
    return fm.paraformer(), fm.write_am_mvn(str(folder / "am.mvn"), *fm.cmvn_stats(560, seed=1))


def _paraformer(model, mvn, out, **kwargs):
    args = dict(tokens=fm.paraformer_tokens(), frontend_conf=fm.frontend_conf(), cmvn=mvn, exporter="torchscript")
    return export_paraformer(model, out, **{**args, **kwargs})


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_paraformer_decodes_in_sherpa_onnx_like_pytorch(paraformer_files, tmp_path, exporter):
    """PyTorch's side is the model's own forward (FunASR's boolean-mask CIF, ``token_num`` positions, one
    utterance at a time); sherpa-onnx decodes a padded batch of the graph (closed-form CIF) up to ``</s>``."""
    _needs_sherpa()
    model, mvn = paraformer_files
    report = _paraformer(model, mvn, tmp_path / "m", exporter=exporter)
    assert sorted(os.listdir(tmp_path / "m")) == ["model.onnx", "tokens.txt"]
    assert report.parts.graphs["model"].exporter == exporter
    _consumers_ran(report)
    meta = report.metadata
    assert {k: meta[k] for k in ("vocab_size", "lfr_window_size", "lfr_window_shift", "model_type")} == {
        "vocab_size": "40", "lfr_window_size": "7", "lfr_window_shift": "6", "model_type": "paraformer"}
    assert len(meta["neg_mean"].split(",")) == 560
    assert "</s> 2" in (tmp_path / "m" / "tokens.txt").read_text(encoding="utf-8").splitlines()


def test_paraformer_graph_is_the_models_decode_and_a_batch_is_its_utterances(paraformer_files):
    """At B=1 the graph's first ``token_num`` positions are the model's log-probs and the rest say ``</s>``; in a
    padded batch FunASR's own forward lets the padded frames into the shorter item's tokens (the predictor's
    convolution and the tail), which the graph does not: its item equals the utterance alone."""
    import torch
    model, _ = paraformer_files
    graph = ParaformerGraph(model, 2)
    torch.manual_seed(3)
    x, lens = torch.randn(2, 31, 560), torch.tensor([31, 19], dtype=torch.int32)
    with torch.no_grad():
        alone, alone_num = model(x[1:, :19], lens[1:])
        logits, num = graph(x[1:, :19], lens[1:])
        k = int(alone_num[0])
        assert k >= 3 and int(num[0]) == k and torch.allclose(logits[0, :k], alone[0], atol=1e-5)
        assert set(logits[0, k:].argmax(-1).tolist()) == {2}
        funasr, funasr_num = model(x, lens)
        batch, batch_num = graph(x, lens)
    assert torch.allclose(batch[1, :k], alone[0], atol=1e-5) and int(batch_num[1]) == k
    assert not torch.allclose(funasr[1, :int(funasr_num[1])], alone[0, :int(funasr_num[1])], atol=1e-3)


def _paraformer_refused(out, **kwargs):
    model = kwargs.pop("model", None) or fm.paraformer()
    with pytest.raises(ContractError) as caught:
        _paraformer(model, fm.cmvn_stats(560), out, **kwargs)
    assert not os.path.exists(out), "nothing is written"
    return caught.value


def test_paraformer_refuses_tokens_without_eos(tmp_path):
    tokens = fm.paraformer_tokens()
    tokens[2] = "<eos>"
    error = _paraformer_refused(tmp_path / "m", tokens=tokens)
    assert error.what == "vocabulary '</s>'" and error.got == "missing"


def test_paraformer_refuses_eos_at_another_id_than_the_models(tmp_path):
    tokens = fm.paraformer_tokens()
    tokens[2], tokens[3] = tokens[3], tokens[2]
    error = _paraformer_refused(tmp_path / "m", tokens=tokens)
    assert error.what == "vocabulary '</s>'" and error.got == "at id 3"


def test_paraformer_refuses_a_vocabulary_that_disagrees_with_the_logits(tmp_path):
    error = _paraformer_refused(tmp_path / "m", tokens=fm.paraformer_tokens(41))
    assert error.what == "vocabulary" and error.got == "41"


@pytest.mark.parametrize("kwargs, what", [
    (dict(cmvn=fm.cmvn_stats(400)), "cmvn neg_mean"),
    (dict(frontend_conf=fm.frontend_conf(upsacle_samples=False)), "frontend_conf 'upsacle_samples'"),
    (dict(frontend_conf=fm.frontend_conf(fs=8000)), "frontend_conf 'fs'"),
    (dict(metadata={"model_type": "paraformer-zh"}), "metadata 'model_type'"),
    (dict(metadata={"neg_mean": "1,2"}), "metadata 'neg_mean'"),
])
def test_paraformer_refuses_what_sherpa_onnx_would_misread(tmp_path, kwargs, what):
    error = _paraformer_refused(tmp_path / "m", **kwargs)
    assert error.what.startswith(what), error


def test_a_graph_sherpa_onnx_would_bind_wrongly_is_refused(sense_voice):
    """The graph itself by position: ``x_length`` int64 where sherpa-onnx hands int32, or logits whose classes are
    not ``vocab_size``."""
    import onnx
    from onnx_compat.contracts import sherpa_sense_voice as sv
    report, out = sense_voice
    meta = report.metadata
    front = sf.FrontEnd(80, 7, 6, meta["neg_mean"], meta["inv_stddev"])
    proto = onnx.load(str(out / "model.onnx"))
    sv.check(proto, meta, front, 16)  # as written: holds
    proto.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    with pytest.raises(ContractError) as caught:
        sv.check(proto, meta, front, 16)
    assert caught.value.what.startswith("input 1 (x_length)") and caught.value.got == "int64", caught.value
    with pytest.raises(ContractError) as caught:
        sv.check(onnx.load(str(out / "model.onnx")), {**meta, "vocab_size": "47"}, front, 16)
    assert caught.value.what == "metadata 'vocab_size'" and caught.value.expected.startswith("48"), caught.value


def test_the_sense_voice_graph_is_funasrs_export_forward(sense_voice_files):
    """The graph is built from the model's parts (FunASR's own ``SenseVoiceSmall.forward`` is its training step):
    it equals ``export_forward`` -- the small model's ``forward`` -- at B=2 with unequal lengths, and the lengths
    reach it (another length changes the shorter item's logits)."""
    import torch
    from onnx_compat.parts.funasr import SenseVoiceGraph
    model, _ = sense_voice_files
    torch.manual_seed(4)
    x, lens = torch.randn(2, 21, 560), torch.tensor([21, 12], dtype=torch.int32)
    lang, norm = torch.tensor([4, 0], dtype=torch.int32), torch.tensor([15, 14], dtype=torch.int32)
    with torch.no_grad():
        graph = SenseVoiceGraph(model)(x, lens, lang, norm)
        assert torch.equal(graph, model(x, lens, lang, norm)[0]) and graph.shape == (2, 25, 48)
        other = SenseVoiceGraph(model)(x, torch.tensor([21, 15], dtype=torch.int32), lang, norm)
    assert not torch.allclose(graph[1, :16], other[1, :16], atol=1e-4)


def test_a_model_without_funasrs_parts_is_refused(tmp_path):
    import torch
    error = _refused(tmp_path / "m", model=torch.nn.Linear(560, 48))
    assert error.what == "model" and "'embed'" in error.got and "'lid_dict'" in error.got
    error = _paraformer_refused(tmp_path / "p", model=fm.sense_voice_small())
    assert error.what == "model" and "'predictor.pad'" in error.got
