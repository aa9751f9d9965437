"""sherpa-onnx's Whisper contract from transformers checkpoint folders (``export_whisper``, issue #48 item 1).

Tiny ``WhisperForConditionalGeneration`` folders written by ``save_pretrained`` (``whisper_tiny``: a fine-tune with
128 mel bins, 3 encoder / 1 decoder layers, a vocabulary of another size and logit ids past the tokenizer, four
languages; an English-only one) export in one call to encoder.onnx, decoder.onnx and a base64 tokens.txt, and
sherpa-onnx decodes WAV files (a tone, a noise burst, a chirp, a speech-like glide) with them -- Python binding and
native binary -- to exactly the tokens of PyTorch's greedy decode under sherpa-onnx's pipeline, the logits from
the checkpoint's own transformers decoder. Each bad input is one error with nothing written.
"""
from __future__ import annotations

import base64
import json
import os

import onnx
import pytest
import torch

from onnx_compat.contracts import ConsumerMismatch, ContractError
from onnx_compat.contracts import sherpa_whisper as sw
from onnx_compat.contracts.sherpa_whisper_consumers import (WhisperBinary, WhisperEager, WhisperPython, greedy_ids,
                                                           signals, whisper_features)
from onnx_compat.errors import ArgumentError
from onnx_compat.huggingface import UncoveredModelError, tiny
from onnx_compat.huggingface import whisper as hw
from onnx_compat.huggingface.job import export_pretrained
from onnx_compat.huggingface.whisper_graphs import WhisperDecoderGraph, WhisperEncoderGraph
from onnx_compat.huggingface.whisper_tiny import PIECES, whisper_checkpoint

FINE_TUNE = dict(n_mels=128, layers=(3, 1), extra_ids=6, languages=("en", "de", "fa", "fr"), seed=1)


def _needs_sherpa():
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory):
    return whisper_checkpoint(tmp_path_factory.mktemp("whisper") / "fine-tune", **FINE_TUNE)


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    return whisper_checkpoint(tmp_path_factory.mktemp("whisper") / "tiny.en", multilingual=False, seed=1)


@pytest.fixture(scope="module")
def exported(fine_tune, tmp_path_factory):
    """The fine-tune written with TorchScript, German, proven in both consumers."""
    _needs_sherpa()
    out = tmp_path_factory.mktemp("written") / "model"
    return export_whisper_checked(fine_tune, out, language="de", exporter="torchscript"), out


def export_whisper_checked(folder, out, **kwargs):
    report = hw.export_whisper(folder, out, **kwargs)
    assert sorted(os.listdir(out)) == ["decoder.onnx", "encoder.onnx", "tokens.txt"]
    checks = report.consumer_checks
    assert [c.get("skipped") for c in checks] == [None, None], checks
    for check in checks:  # a decode that emits nothing, or one token over and over, compares nothing
        assert check["ok"] and sum(check["tokens"]) >= 10 and max(check["distinct"]) >= 3, check
        assert check["unnamed"] == [0, 0, 0, 0], check  # every id decoded has a symbol: the comparison is by id
    return report


def test_the_graphs_compute_what_the_checkpoint_computes(fine_tune):
    """The encoder at transformers' only length (3000 frames) equals ``WhisperEncoder``; decoder calls as sherpa-onnx
    makes them (the initial tokens at offset 0 on zero caches, then one token at a time, B=2) equal the logits of
    transformers' decoder run on the whole prefix."""
    model = hw.load_whisper(fine_tune)
    enc, dec = WhisperEncoderGraph(model), WhisperDecoderGraph(model)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="expects the mel input features to be of length 3000"):
        model.model.encoder(torch.randn(1, 128, 1301))  # why the encoder graph is the modules, positions cut
    with torch.no_grad():
        mel = torch.randn(1, 128, 3000)
        assert torch.equal(enc.hidden(mel), model.model.encoder(mel).last_hidden_state)
        mel = torch.randn(2, 128, 1301)
        hidden, (k, v) = enc.hidden(mel), enc(mel)
        assert k.shape == (1, 2, 651, 32)  # ceil(1301 / 2) positions
        tokens = torch.tensor([[61, 62, 67, 71, 5, 9, 30], [61, 64, 67, 71, 41, 2, 7]])
        full = model.proj_out(model.model.decoder(input_ids=tokens, encoder_hidden_states=hidden).last_hidden_state)
        cache = torch.zeros(1, 2, 448, 32)
        logits, sk, sv = dec(tokens[:, :4], cache, cache, k, v, torch.tensor([0]))
        assert torch.allclose(logits, full[:, :4], atol=1e-5)
        for i in range(4, 7):
            logits, sk, sv = dec(tokens[:, i:i + 1], sk, sv, k, v, torch.tensor([i]))
            assert torch.allclose(logits[:, 0], full[:, i], atol=1e-5), i
        assert sk[:, :, 7:].abs().max() == 0 and sk[:, :, :7].abs().min() > 0  # written at [0, 7) only


def test_a_multilingual_fine_tune_decodes_in_sherpa_onnx_like_pytorch(exported):
    report, out = exported
    meta = report.metadata
    assert report.language == "de" and json.loads(report.to_json())["metadata"] == meta  # the CLI's --json
    assert {k: meta[k] for k in ("n_mels", "n_text_layer", "n_text_ctx", "n_text_state", "is_multilingual")} == \
        {"n_mels": "128", "n_text_layer": "1", "n_text_ctx": "448", "n_text_state": "32", "is_multilingual": "1"}
    assert meta["all_language_codes"] == "en,de,fa,fr" and meta["all_language_tokens"] == "62,63,64,65"
    assert meta["sot_sequence"] == "61,63,67"  # sot, <|de|>, transcribe
    assert int(meta["n_vocab"]) == len(PIECES) + 2 + 4 + 6 + 4 + 6  # the logits: ids past the tokenizer too
    lines = (out / "tokens.txt").read_text().splitlines()
    pieces = {int(i): base64.b64decode(b) for b, i in (line.split() for line in lines)}
    assert len(pieces) == len(PIECES) and pieces[0] == b" " and pieces[3] == "é".encode()  # raw bytes, not Ġ / Ã©


def test_the_comparison_sees_the_language_and_the_decoders_history(exported, fine_tune):
    """PyTorch's decode with English differs from German (so sherpa-onnx got the language the export chose), and a
    reference that forgets every token but the last disagrees with sherpa-onnx (so the cache is compared)."""
    report, out = exported
    model, meta = hw.load_whisper(fine_tune), report.metadata
    german = hw.reference(model, meta, "de")
    english = WhisperEager(german.hidden, german.logits, [61, 62, 67, 71], german.eot, german.n_text_ctx)
    feats = (whisper_features(s, 128) for s in signals())
    assert any(greedy_ids(german, *f) != greedy_ids(english, *f) for f in feats)
    forgetful = WhisperEager(german.hidden, lambda t, h: german.logits(t[:, -1:], h), german.initial, german.eot,
                             german.n_text_ctx)
    with pytest.raises(ConsumerMismatch):
        WhisperPython("de").verify(str(out), forgetful, hw.read_vocabulary(fine_tune), 128)


def test_what_the_base64_tokens_prevent(exported, fine_tune, tmp_path):
    """The same graphs with tokens.txt spelled as vocab.json spells the pieces (``Ġa``, ``.``): sherpa-onnx
    base64-decodes every symbol and ends the process on a character outside base64's alphabet."""
    import shutil
    report, out = exported
    spelled = tmp_path / "spelled"
    shutil.copytree(out, spelled)
    (spelled / "tokens.txt").write_text("".join(f"{p} {i}\n" for i, p in enumerate(PIECES)), encoding="utf-8")
    model = hw.load_whisper(fine_tune)
    with pytest.raises(ConsumerMismatch) as caught:
        WhisperPython("de").verify(str(spelled), hw.reference(model, report.metadata, "de"),
                                   hw.read_vocabulary(fine_tune), 128)
    assert "exit code" in str(caught.value.got), caught.value


def test_a_piece_that_is_not_complete_utf8_is_compared_as_each_consumer_says_it(exported, fine_tune, tmp_path):
    """A byte-level piece of a non-Latin script alone (here the lone byte 0xC3 in place of the first id decoded):
    the Python binding's ``result.tokens`` raises on it (measured), so that utterance is compared by
    ``result.text``; the native binary prints it ``<0xC3>``. Both still agree with PyTorch."""
    import dataclasses
    import shutil
    report, out = exported
    ids = report.consumer_checks[0]["ids"]
    first = ids[0][0]
    vocabulary = hw.read_vocabulary(fine_tune)
    vocabulary = dataclasses.replace(vocabulary, pieces={**vocabulary.pieces, first: b"\xc3"}, notes=[])
    assert vocabulary.partial() == [first]
    folder = tmp_path / "partial"
    shutil.copytree(out, folder)
    (folder / "tokens.txt").write_text(sw.tokens_text(vocabulary), encoding="utf-8")
    eager = hw.reference(hw.load_whisper(fine_tune), report.metadata, "de")
    python = WhisperPython("de").verify(str(folder), eager, vocabulary, 128, ids)
    assert python["ok"] and python["by_text"] == [k for k, i in enumerate(ids) if first in i], python
    native = WhisperBinary("de").verify(str(folder), eager, vocabulary, 128, ids)
    assert native["ok"] and native["by_text"] == [] and "<0xC3>" in vocabulary.symbols(native=True).values()


def test_an_english_only_checkpoint_decodes_in_sherpa_onnx_with_dynamo(english, tmp_path):
    _needs_sherpa()
    report = export_whisper_checked(english, tmp_path / "model", exporter={"encoder": "torchscript",
                                                                            "decoder": "dynamo"})
    assert report.parts.graphs["decoder"].exporter == "dynamo"
    meta = report.metadata
    assert meta["is_multilingual"] == "0" and meta["sot_sequence"] == meta["sot"] and report.language is None
    assert "all_language_tokens" not in meta and meta["n_mels"] == "80"


def _refused(folder, out, error, **kwargs):
    with pytest.raises(error) as caught:
        hw.export_whisper(folder, out, **kwargs)
    assert not os.path.exists(out), "nothing is written"
    return caught.value


@pytest.mark.parametrize("language", ["ja", ""])
def test_a_language_the_model_lacks_is_refused(fine_tune, tmp_path, language):
    error = _refused(fine_tune, tmp_path / "m", ContractError, language=language)
    assert error.what == "language" and "'en', 'de', 'fa', 'fr'" in error.expected


def test_an_english_only_model_takes_no_other_language(english, tmp_path):
    error = _refused(english, tmp_path / "m", ContractError, language="de")
    assert error.what == "language" and "English-only" in error.expected


def test_a_tokenizer_naming_ids_the_logits_lack_is_refused(tmp_path):
    folder = whisper_checkpoint(tmp_path / "short", extra_ids=-2)
    error = _refused(folder, tmp_path / "m", ContractError)
    assert error.what == "vocabulary" and error.got == "ids [73, 74]", error


@pytest.mark.parametrize("metadata, what", [
    ({"is_multilingual": "True"}, "metadata 'is_multilingual'"),  # atoi reads True as 0
    ({"sot_sequence": "61,63,65"}, "metadata 'sot_sequence'"),    # translate where transcribe must be
    ({"n_mels": "64"}, "metadata 'n_mels'"),                      # not the graph's
    ({"all_language_codes": "en,de"}, "metadata 'all_language_tokens'/'all_language_codes'"),
])
def test_metadata_sherpa_onnx_would_misread_is_refused(tmp_path, metadata, what):
    folder = whisper_checkpoint(tmp_path / "ck")
    error = _refused(folder, tmp_path / "m", ContractError, metadata=metadata)
    assert error.what.startswith(what), error


def test_a_tokenizer_without_a_special_token_sherpa_onnx_reads_is_refused(tmp_path):
    folder = whisper_checkpoint(tmp_path / "no-notimestamps", drop=("<|notimestamps|>",))
    error = _refused(folder, tmp_path / "m", ContractError)
    assert (error.what, error.got) == ("tokenizer token <|notimestamps|>", "missing")


def test_an_encoder_with_fewer_positions_than_sherpa_onnx_feeds_is_refused(tmp_path):
    folder = whisper_checkpoint(tmp_path / "short-audio", audio_ctx=750)
    error = _refused(folder, tmp_path / "m", ContractError)
    assert error.what.startswith("config max_source_positions") and error.got == "750"


def test_a_checkpoint_that_is_not_whisper_is_refused(tmp_path):
    folder = tiny.checkpoint(tmp_path / "w2v", "wav2vec2", "ctc")
    assert _refused(folder, tmp_path / "m", UncoveredModelError).covered == ("whisper",)


def test_export_pretrained_routes_the_contract_to_export_whisper(english, tmp_path):
    """``export_pretrained(..., contract="sherpa-onnx/whisper")`` (what ``onnx-compat export hf:DIR`` calls) writes
    a folder: an .onnx path, or an option that means nothing for it, is refused before any work; the rest reaches
    ``export_whisper``'s checks."""
    with pytest.raises(ArgumentError) as caught:
        export_pretrained(english, tmp_path / "model.onnx", contract=sw.NAME)
    assert caught.value.argument == "out"
    with pytest.raises(ArgumentError) as caught:
        export_pretrained(english, tmp_path / "m", contract=sw.NAME, quantize="int8-dynamic")
    assert caught.value.argument == "quantize"
    with pytest.raises(ContractError) as caught:
        export_pretrained(english, tmp_path / "m", contract=sw.NAME, language="fr", exporter="torchscript",
                          verify=True, progress=None, metadata={})
    assert caught.value.what == "language" and not os.path.exists(tmp_path / "m")


def test_tokens_txt_holds_each_pieces_bytes_and_no_special_token():
    vocabulary = sw.WhisperVocabulary({0: b" ", 1: "é".encode(), 2: b"ab"}, {"eot": 3}, {}, False)
    text = sw.tokens_text(vocabulary)
    assert text == "IA== 0\nw6k= 1\nYWI= 2\n"
    assert vocabulary.symbols() == {0: " ", 1: "é", 2: "ab"}


def test_a_tokenizer_leaving_ids_unnamed_below_the_timestamps_is_refused():
    """An id below the first timestamp without a token would be decoded with no symbol (sherpa-onnx skips it
    silently); ids past the first timestamp may be unnamed (older tokenizers name no timestamps)."""
    specials = {"sot": 4, "eot": 3, "translate": 5, "transcribe": 6, "no_timestamps": 7, "no_speech": 8}
    vocabulary = sw.WhisperVocabulary({0: b"a", 2: b"b"}, specials, {}, False)
    found = sw.vocabulary_findings(vocabulary, 12)
    assert [(f.what, f.got) for f in found] == [("vocabulary", "ids [1] have no token")]
    whole = sw.WhisperVocabulary({0: b"a", 1: b"c", 2: b"b"}, specials, {}, False)
    assert sw.vocabulary_findings(whole, 12) == []


def test_a_multilingual_model_without_its_language_lists_is_a_finding():
    """sherpa-onnx ends the process when is_multilingual is 1 and a language list is missing."""
    vocabulary = sw.WhisperVocabulary({0: b"a"}, {"sot": 2, "eot": 1, "translate": 4, "transcribe": 5,
                                                  "no_timestamps": 6, "no_speech": 7, "blank_id": 0}, {"en": 3}, True)
    meta = sw.encoder_metadata(vocabulary, {"n_mels": 80, "n_text_layer": 1, "n_text_ctx": 448, "n_text_state": 8,
                                            "n_vocab": 10}, "en", "x")
    assert sw.metadata_findings(meta, vocabulary, {}) == []
    del meta["all_language_codes"]
    assert [(f.what, f.got) for f in sw.metadata_findings(meta, vocabulary, {})] == \
        [("metadata 'all_language_codes'", "missing")]


def test_the_cli_writes_the_whisper_folder(fine_tune, tmp_path, capsys):
    """``onnx-compat export hf:DIR --contract sherpa-onnx/whisper --language de --out FOLDER``: the folder of the
    two graphs and tokens.txt, with the language in the metadata's sot_sequence (the consumers' decode proof is
    the library's, tested above; here the command routes to it)."""
    from onnx_compat.cli import main
    out = tmp_path / "model"
    code = main(["export", f"hf:{fine_tune}", "--contract", "sherpa-onnx/whisper", "--language", "de",
                 "--exporter", "torchscript", "--no-verify", "--quiet", "--out", str(out),
                 "--json", str(tmp_path / "report.json")])
    assert code == 0, capsys.readouterr()
    assert sorted(os.listdir(out)) == ["decoder.onnx", "encoder.onnx", "tokens.txt"]
    meta = {p.key: p.value for p in onnx.load(str(out / "encoder.onnx"), load_external_data=False).metadata_props}
    vocab = hw.read_vocabulary(str(fine_tune))
    assert meta["sot_sequence"].split(",")[1] == str(vocab.languages["de"])
    assert json.loads((tmp_path / "report.json").read_text())["language"] == "de"


@pytest.mark.parametrize("argv, option", [
    (["--contract", "sherpa-onnx/whisper", "--language", "xx"], "language"),   # a language the model lacks
    (["--language", "de"], "--language"),                                      # --language without the contract
])
def test_the_cli_refuses_whisper_options_before_any_work(fine_tune, tmp_path, capsys, argv, option):
    from onnx_compat.cli import main
    out = tmp_path / "model"
    code = main(["export", f"hf:{fine_tune}", "--quiet", "--out", str(out), *argv])
    assert code == 2, capsys.readouterr()
    assert option in capsys.readouterr().err
    assert not out.exists()


def test_the_cli_refuses_the_whisper_contract_for_a_factory(tmp_path, capsys):
    from onnx_compat.cli import main
    code = main(["export", "onnx_compat.models.conformer:demo_job", "--contract", "sherpa-onnx/whisper",
                 "--out", str(tmp_path / "m")])
    assert code == 2
    assert "hf:DIR" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
