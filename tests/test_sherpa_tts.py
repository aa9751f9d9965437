"""sherpa-onnx's offline TTS contracts (``export_vits``, ``export_matcha``; issue #49).

Small voices of piper's VITS structure (``onnx_compat.models.vits``: relative-position text encoder, duration
predictor, coupling flow, HiFi-GAN decoder; single- and multi-speaker) and a Matcha acoustic model with a HiFi-GAN
and a Vocos vocoder (``onnx_compat.models.matcha_tts``) export in one call each; sherpa-onnx synthesizes three
texts (four sentences) from the written folder -- Python ``OfflineTts`` and the native ``sherpa-onnx-offline-tts``
-- to PyTorch's waveform of the same token ids: the sample count exactly, every sample within the stated tolerance.
Each bad input is one error with nothing written.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from onnx_compat.contracts import ConsumerMismatch, ContractError
from onnx_compat.contracts import sherpa_tts as st
from onnx_compat.contracts.sherpa_tts_consumers import STEP16, TtsPython, TtsRun
from onnx_compat.models.vits import tiny_vits, tiny_voice
from onnx_compat.parts.sherpa_tts import CONSUMER_ATOL, export_vits, synthesize

PUNCTUATION = ", . ! ?"


def _needs_sherpa():
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")


def _proven(report, speakers: int) -> None:
    """Both consumers ran and matched: each text's sample count exact, every sample within the tolerance."""
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:
        assert check["ok"] and check["texts"] == 3
        native = "native" in check["consumer"]
        assert check["max_abs_err"] <= CONSUMER_ATOL + (STEP16 if native else 0)
        for case in check["cases"]:
            assert case["samples"] >= 500 and case["peak"] > 0.1  # not degenerate: audible audio of many frames
    meta = report.metadata["model"]
    assert meta["n_speakers"] == str(speakers) and meta["comment"] == "piper" and meta["sample_rate"] == "16000"


@pytest.fixture(scope="module")
def voice():
    return tiny_voice()


@pytest.fixture(scope="module")
def single(voice, tmp_path_factory):
    """A single-speaker voice written with TorchScript, proven in both consumers."""
    _needs_sherpa()
    tokens, lexicon = voice
    model = tiny_vits(len(tokens), seed=1)
    out = tmp_path_factory.mktemp("vits") / "single"
    report = export_vits(model, out, tokens=tokens, lexicon=lexicon, sample_rate=16000, punctuation=PUNCTUATION,
                         exporter="torchscript")
    return model, report, out


def test_vits_single_speaker_synthesizes_pytorchs_audio(single):
    model, report, out = single
    assert sorted(os.listdir(out)) == ["lexicon.txt", "model.onnx", "tokens.txt"]
    _proven(report, 1)
    proto = onnx.load(os.path.join(out, "model.onnx"))
    assert [v.name for v in proto.graph.input] == ["x", "x_length", "scales"]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["language"] == "English" and meta["punctuation"] == PUNCTUATION
    assert report.parts.graphs["model"].exporter == "torchscript"
    assert len(report.texts) == 3 and sum(len(s) for s in report.ids) == 4  # the last text holds two sentences


def test_vits_multi_speaker_dynamo(voice, tmp_path):
    """Three speakers, the proof with speaker 2 (the graph's 4th input named ``sid``), exported by dynamo."""
    _needs_sherpa()
    tokens, lexicon = voice
    model = tiny_vits(len(tokens), n_speakers=3, seed=2)
    report = export_vits(model, tmp_path / "multi", tokens=tokens, lexicon=lexicon, sample_rate=16000,
                         punctuation=PUNCTUATION, sid=2, exporter="dynamo")
    _proven(report, 3)
    assert report.parts.graphs["model"].exporter == "dynamo"
    proto = onnx.load(tmp_path / "multi" / "model.onnx")
    assert [v.name for v in proto.graph.input] == ["x", "x_length", "scales", "sid"]
    assert all(c["sid"] == 2 for c in report.consumer_checks)


def test_vits_coqui_variant(voice, tmp_path):
    """``comment`` coqui: the same layout, coqui's bos/eos/blank keys written; sherpa-onnx synthesizes PyTorch's
    audio from it too."""
    _needs_sherpa()
    tokens, lexicon = voice
    report = export_vits(tiny_vits(len(tokens), seed=4), tmp_path / "coqui", tokens=tokens, lexicon=lexicon,
                         sample_rate=22050, variant="coqui", punctuation=PUNCTUATION, exporter="torchscript")
    meta = report.metadata["model"]
    assert meta["comment"] == "coqui" and meta["use_eos_bos"] == "0" and meta["sample_rate"] == "22050"
    assert [c.get("skipped") for c in report.consumer_checks] == [None, None]
    assert all(c["ok"] and c["max_abs_err"] <= CONSUMER_ATOL + STEP16 for c in report.consumer_checks)


def test_vits_proof_fails_on_another_voice(single, voice):
    """The comparison can fail: PyTorch's audio of the same ids from a voice of other weights differs (same
    durations are not guaranteed either: either count or values differ)."""
    model, report, out = single
    tokens, _ = voice
    other = tiny_vits(len(tokens), seed=7)
    expected = [np.concatenate([synthesize(other, s).double().numpy() for s in ids]) for ids in report.ids]
    with pytest.raises(ConsumerMismatch) as info:
        TtsPython().verify(str(out), TtsRun("vits", report.texts, 0, expected, 16000), CONSUMER_ATOL)
    assert info.value.case == 0


def test_text_to_ids_follows_sherpas_lexicon_front_end(voice):
    tokens, lexicon = voice
    v = st.Voice(tokens, lexicon, punctuation=PUNCTUATION)
    space = tokens[" "]
    hello, world = [tokens[s] for s in lexicon["hello"]], [tokens[s] for s in lexicon["world"]]
    # each word then " "; a kept mark after it; '.' ends the sentence with one more " ", ',' does not; unknown
    # words skipped; the text's last " " dropped
    assert st.text_to_ids("Hello, WORLD. zebra world", v) == [
        hello + [space, tokens[","]] + world + [space, tokens["."], space], world]
    assert st.text_to_ids("hello", st.Voice(tokens, lexicon, add_blank=True)) == [
        [0] + [k for i in hello for k in (i, 0)]]


def _refused(tmp_path, voice, **change):
    tokens, lexicon = voice
    kwargs = dict(tokens=tokens, lexicon=lexicon, sample_rate=16000, punctuation=PUNCTUATION, exporter="torchscript")
    speakers = change.pop("speakers", 1)
    kwargs.update(change)
    out = tmp_path / "refused"
    with pytest.raises(ContractError) as info:
        export_vits(tiny_vits(len(tokens), n_speakers=speakers), out, **kwargs)
    assert not out.exists()
    return info.value


def test_vits_refuses_tokens_without_pipers_symbols(tmp_path, voice):
    tokens = {s: i for s, i in voice[0].items() if s not in ("^", "$")}
    error = _refused(tmp_path, voice, tokens=tokens)
    assert "missing ['^', '$']" in str(error) and error.what == "tokens"


def test_vits_refuses_coqui_tokens_without_comma(tmp_path, voice):
    tokens = {s: i for s, i in voice[0].items() if s != ","}
    error = _refused(tmp_path, voice, tokens=tokens, variant="coqui", punctuation=". !")
    assert "missing [',']" in str(error)


def test_vits_refuses_speaker_outside_n_speakers(tmp_path, voice):
    error = _refused(tmp_path, voice, speakers=3, sid=3)
    assert error.what == "speaker id" and "[3]" in error.got
    error = _refused(tmp_path, voice, speakers=3, metadata={"n_speakers": "2"})
    assert error.what == "metadata 'n_speakers'"


def test_vits_refuses_missing_sample_rate(tmp_path, voice):
    error = _refused(tmp_path, voice, sample_rate=None)
    assert error.what.startswith("metadata 'sample_rate'") and error.got == "missing"


def test_vits_refuses_lexicon_with_unknown_symbols_and_long_tokens(tmp_path, voice):
    tokens, lexicon = voice
    error = _refused(tmp_path, voice, lexicon={**lexicon, "zebra": ["z", "ɛ", "b"]})
    assert "unknown symbols ['z']" in str(error)
    error = _refused(tmp_path, voice, tokens={**tokens, "aa": len(tokens)})
    assert "one Unicode character" in str(error)
    error = _refused(tmp_path, voice, lexicon={})
    assert error.what == "lexicon" and error.got == "no words"
    assert _refused(tmp_path, voice, texts=[]).what == "proof texts"


def test_vits_refuses_a_fourth_input_not_named_sid(single):
    """sherpa-onnx feeds the speaker only to an input named ``sid``: the name check finds another name."""
    proto = onnx.load(os.path.join(single[2], "model.onnx"))
    proto.graph.input.add().CopyFrom(onnx.helper.make_tensor_value_info("speaker", onnx.TensorProto.INT64, [1]))
    found = st.name_findings(proto, {3: "sid"}, "model")
    assert len(found) == 1 and found[0].got == "'speaker'"


def _matcha(voice, out, kind, exporter, **change):
    from onnx_compat.models.matcha_tts import tiny_matcha, tiny_vocoder
    from onnx_compat.parts.sherpa_tts import export_matcha
    tokens, lexicon = voice
    kwargs = dict(vocoder_type=kind, tokens=tokens, lexicon=lexicon, sample_rate=16000, exporter=exporter)
    vocoder = change.pop("vocoder", None) or tiny_vocoder(kind, seed=3)
    kwargs.update(change)
    return export_matcha(tiny_matcha(len(tokens), seed=3), vocoder, out, **kwargs)


@pytest.mark.parametrize("kind, exporter", [("hifigan", "torchscript"), ("vocos", "dynamo"), ("vocos", "torchscript")])
def test_matcha_with_vocoder_synthesizes_pytorchs_audio(voice, tmp_path, kind, exporter):
    """Matcha with 3 Euler steps baked in; HiFi-GAN (TorchScript) and Vocos (sherpa-onnx's own inverse STFT against
    ``torch.istft``; TorchScript leaves its ``n_fft/2+1`` bins symbolic, which the contract refused until the
    verified size was written into the graph) as the vocoder."""
    _needs_sherpa()
    out = tmp_path / kind
    report = _matcha(voice, out, kind, exporter)
    assert sorted(os.listdir(out)) == ["acoustic_model.onnx", "lexicon.txt", "tokens.txt", "vocoder.onnx"]
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:
        assert check["ok"] and check["texts"] == 3
        assert check["max_abs_err"] <= CONSUMER_ATOL + (STEP16 if "native" in check["consumer"] else 0)
        assert all(case["samples"] >= 500 and case["peak"] > 0.1 for case in check["cases"])
    acoustic = onnx.load(out / "acoustic_model.onnx")
    assert [v.name for v in acoustic.graph.input] == ["x", "x_length", "scales"]
    meta = {p.key: p.value for p in acoustic.metadata_props}
    assert meta["num_ode_steps"] == "3" and meta["jieba"] == "1"
    vocoder_graph = onnx.load(out / "vocoder.onnx")
    dims = [[d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in vocoder_graph.graph.output]
    assert all(d[1] == (33 if kind == "vocos" else d[1]) for d in dims), dims
    vocoder = {p.key: p.value for p in vocoder_graph.metadata_props}
    assert vocoder["model_type"] == kind
    if kind == "vocos":
        assert (vocoder["n_fft"], vocoder["hop_length"], vocoder["window_type"]) == ("64", "16", "hann")
    assert {g.exporter for g in report.parts.graphs.values()} == {exporter}


def test_matcha_multi_speaker(voice, tmp_path):
    """Three speakers in icefall's layout, the only one sherpa-onnx gives a speaker to (5 inputs, the last named
    ``sid``); the proof with speaker 2 matches PyTorch's speaker 2."""
    _needs_sherpa()
    from onnx_compat.models.matcha_tts import tiny_matcha, tiny_vocoder
    from onnx_compat.parts.sherpa_tts import export_matcha
    tokens, lexicon = voice
    out = tmp_path / "speakers"
    report = export_matcha(tiny_matcha(len(tokens), n_spks=3, seed=5), tiny_vocoder("hifigan"), out,
                           vocoder_type="hifigan", tokens=tokens, lexicon=lexicon, sample_rate=16000, sid=2,
                           exporter="torchscript")
    acoustic = onnx.load(out / "acoustic_model.onnx")
    assert [v.name for v in acoustic.graph.input] == ["x", "x_length", "noise_scale", "length_scale", "sid"]
    assert report.metadata["acoustic_model"]["n_speakers"] == "3"
    assert [c.get("skipped") for c in report.consumer_checks] == [None, None]
    assert all(c["ok"] and c["sid"] == 2 and c["max_abs_err"] <= CONSUMER_ATOL + STEP16 for c in report.consumer_checks)
    with pytest.raises(ContractError) as info:
        export_matcha(tiny_matcha(len(tokens), n_spks=3, seed=5), tiny_vocoder("hifigan"), tmp_path / "no",
                      vocoder_type="hifigan", tokens=tokens, lexicon=lexicon, sample_rate=16000, sid=3)
    assert info.value.what == "speaker id" and not (tmp_path / "no").exists()


def test_matcha_refuses_vocoder_of_other_mel_bins(voice, tmp_path):
    from onnx_compat.models.matcha_tts import tiny_vocoder
    with pytest.raises(ContractError) as info:
        _matcha(voice, tmp_path / "m", "hifigan", "torchscript", vocoder=tiny_vocoder("hifigan", n_mels=24))
    assert info.value.what == "vocoder mel bins" and (info.value.expected, info.value.got) == (
        "20 (the acoustic model's mel)", "24")
    assert not (tmp_path / "m").exists()


def test_matcha_refuses_missing_sample_rate_and_multi_sentence_texts(voice, tmp_path):
    with pytest.raises(ContractError) as info:
        _matcha(voice, tmp_path / "m", "vocos", "torchscript", sample_rate=None)
    assert info.value.what.startswith("metadata 'sample_rate'")
    with pytest.raises(ContractError) as info:
        _matcha(voice, tmp_path / "m", "vocos", "torchscript", texts=["hello world. this is a test."])
    assert info.value.what == "proof text 0"
    with pytest.raises(ContractError) as info:
        _matcha(voice, tmp_path / "m", "vocos", "torchscript", lexicon={})
    assert info.value.what == "lexicon"
    assert not (tmp_path / "m").exists()


def test_matcha_text_to_ids_as_sherpa_2_0_1_feeds_them(voice):
    """Measured with sherpa-onnx 2.0.1's debug log: 'Hello zebra world' -> [0, h, 0, ..., 0, ' ', 0, w, ...]."""
    tokens, lexicon = voice
    v = st.Voice(tokens, lexicon)
    ids = [tokens[s] for s in lexicon["hello"]] + [tokens[" "]] + [tokens[s] for s in lexicon["world"]]
    assert st.matcha_text_to_ids("Hello zebra world", v, 0) == [0] + [k for i in ids for k in (i, 0)]
    with_mark = st.matcha_text_to_ids("hello, world!", v, 0)
    assert with_mark[-2:] == [tokens["!"], 0]
    assert tokens[","] not in with_mark[1::2]
