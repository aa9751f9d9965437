"""Consumer contracts: refused before writing when the consumer would break, and proven inside the consumer.

The bundled Conformer in sherpa-onnx's NeMo CTC layout (``consumer_models``)
decodes in sherpa-onnx -- its Python binding and its native binary, one
batch of four utterances of different lengths, features from sherpa-onnx's
own front-end -- to exactly the tokens of PyTorch's greedy decode, with both
exporters. With "valid" subsampling it has fewer frames than sherpa-onnx
decodes: the contract refuses it, and the test shows what it prevents.
"""
from __future__ import annotations

import os

import onnx
import pytest
import torch

from onnx_compat import export
from onnx_compat.contracts import CONTRACTS, ConsumerMismatch, ContractError, apply_contract, check_specs
from onnx_compat.contracts.consumers import run_child
from onnx_compat.contracts.sherpa_consumers import NemoCtcPython
from onnx_compat.models import blstm, conformer
import consumer_models as cm
from helpers import EXPORTERS

NEMO = "sherpa-onnx/nemo-ctc"
SPEAKER = "sherpa-onnx/speaker-embedding"
NEMO_META = {"normalize_type": "per_feature"}


def _exported(model, inputs, outputs, tmp_path, exporter="torchscript", **kwargs):
    path = os.path.join(tmp_path, f"model_{exporter}.onnx")
    export(model, path, inputs, outputs, exporter=exporter, **kwargs)
    return onnx.load(path)


def _quick(model, inputs, outputs, tmp_path):
    """An export for the refusal tests, which check the graph's ports and metadata, not its numbers."""
    return _exported(model, inputs, outputs, tmp_path, verify=False, cleanup=False)


@pytest.fixture(scope="module")
def conformer_valid(tmp_path_factory):
    """The Conformer with its "valid" subsampling: (T - 3) // 4 frames."""
    inputs, outputs = cm.nemo_specs()
    model = cm.conformer_ctc(right_pad=0)
    return model, _quick(model, inputs, outputs, tmp_path_factory.mktemp("valid"))


@pytest.fixture(scope="module")
def conformer_nemo(tmp_path_factory):
    """The Conformer padded to T // 4 frames, exported (and verified) once for the tests that only read it."""
    inputs, outputs = cm.nemo_specs()
    model = cm.conformer_ctc()
    return model, _exported(model, inputs, outputs, tmp_path_factory.mktemp("nemo"))


@pytest.fixture(scope="module")
def speaker_net(tmp_path_factory):
    inputs, outputs = cm.speaker_specs()
    model = cm.SpeakerNet().eval()
    return model, _quick(model, inputs, outputs, tmp_path_factory.mktemp("speaker"))


def test_registry_names():
    assert [c.name for c in CONTRACTS] == ["rasr", NEMO, SPEAKER]
    with pytest.raises(ValueError, match="unknown contract 'kaldi'"):
        check_specs("kaldi", *cm.nemo_specs())


def test_bundled_conformer_default_io_is_refused_before_export():
    """[B, T, F] with int32 lengths: sherpa-onnx would fail at its first decode with a shape error."""
    with pytest.raises(ContractError) as err:
        check_specs(NEMO, *conformer.io_specs())
    found = {f.what: (f.expected, f.got) for f in err.value.findings}
    assert found["input 0 (features) 'data' dim 1 (C) of [N, C, T]"] == ("C static", "Dim('time')")
    assert found["input 1 (feature lengths) 'data:size1'"] == ("int64 of rank 1", "int32 of rank 1")
    assert err.value.contract == NEMO and err.value.what.startswith("input 0")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_conformer_decodes_in_sherpa_onnx_like_pytorch(exporter, tmp_path):
    """export(contract=..., vocabulary=...): the Python recognizer and the native binary, batched, give PyTorch's
    greedy tokens exactly; the metadata is on the model and tokens.txt beside it."""
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("kaldi_native_fbank")
    inputs, outputs = cm.nemo_specs()
    path = str(tmp_path / "model.onnx")
    report = export(cm.conformer_ctc(), path, inputs, outputs, exporter=exporter, contract=NEMO,
                    vocabulary=cm.vocabulary(), metadata=NEMO_META)
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert {k: meta[k] for k in ("vocab_size", "subsampling_factor", "normalize_type")} == \
        {"vocab_size": "12", "subsampling_factor": "4", "normalize_type": "per_feature"}
    assert (tmp_path / "tokens.txt").read_text().splitlines()[-1] == "<blk> 11"
    checks = report.contract["consumer_checks"]
    assert [c.get("skipped") for c in checks] == [None, None], checks  # both consumers ran
    for check in checks:
        assert check["ok"] and len(set(check["frames"])) == 4, check  # four lengths in one batch
        assert min(check["tokens"]) >= 3, f"degenerate decode, nothing compared: {check}"


def test_the_reference_runs_in_eval_mode(conformer_nemo):
    """A model handed over in training mode (the pipeline does, after a TorchScript capture) is decoded by
    PyTorch in eval mode, as exported, and left in training mode."""
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("kaldi_native_fbank")
    model, proto = conformer_nemo[0], onnx.ModelProto.FromString(conformer_nemo[1].SerializeToString())
    inputs, outputs = cm.nemo_specs()
    applied = apply_contract(NEMO, proto, inputs, outputs, vocabulary=cm.vocabulary(), metadata=NEMO_META)
    model.train()
    try:
        (check,) = applied.verify_in_consumer(proto, model, inputs, only=[NemoCtcPython().name])
        assert all(m.training for m in model.modules()), "the model's training flags were not restored"
    finally:
        model.eval()
    assert check["ok"], check


def test_valid_subsampling_is_refused_and_what_that_prevents(conformer_valid, tmp_path):
    """(T - 3) // 4 frames < T // 4: refused, the proto untouched; written anyway, sherpa-onnx decodes
    frames the model never produced and its tokens differ from PyTorch's."""
    model, proto = conformer_valid
    inputs, outputs = cm.nemo_specs()
    before = proto.SerializeToString()
    with pytest.raises(ContractError) as err:
        apply_contract(NEMO, proto, inputs, outputs, vocabulary=cm.vocabulary(), metadata=NEMO_META)
    assert err.value.what == "output 0 frames" and "7 at T=32 (decodes 8)" in err.value.got, err.value
    assert proto.SerializeToString() == before
    refused = tmp_path / "refused"
    refused.mkdir()
    with pytest.raises(ContractError, match="output 0 frames"):
        export(model, str(refused / "model.onnx"), inputs, cm.nemo_specs()[1], exporter="torchscript", contract=NEMO,
               vocabulary=cm.vocabulary(), metadata=NEMO_META)
    assert os.listdir(refused) == []  # neither the model nor tokens.txt
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("kaldi_native_fbank")
    forced = _force(proto, inputs, outputs)
    with pytest.raises(ConsumerMismatch) as mismatch:
        forced.verify_in_consumer(proto, model, inputs, only=[NemoCtcPython().name])
    assert "sherpa-onnx decodes" in str(mismatch.value), mismatch.value


def _force(proto, inputs, outputs):
    """The contract's result without its frames probe: what a hand-written export would ship."""
    from dataclasses import replace
    from onnx_compat.contracts import sherpa_onnx as so
    contract = replace(so.NEMO_CTC, probes=(so.vocabulary_fits,))
    applied = contract.check(proto, cm.vocabulary(), dict(NEMO_META, subsampling_factor="4"))
    for key, value in applied.metadata.items():
        proto.metadata_props.add(key=key, value=value)
    return applied


@pytest.mark.parametrize("metadata, vocabulary, what, got", [
    ({}, cm.vocabulary(), "metadata 'normalize_type' (how sherpa-onnx normalizes the features)", "missing"),
    ({"normalize_type": "all_features"}, cm.vocabulary(), "metadata 'normalize_type' (how sherpa-onnx normalizes "
     "the features)", "'all_features'"),
    ({"normalize_type": "NA", "subsampling_factor": "four"}, cm.vocabulary(),
     "metadata 'subsampling_factor' (frames per output frame)", "'four'"),
    (NEMO_META, None, "vocabulary", "none (export(..., vocabulary=[...]))"),
    (NEMO_META, cm.vocabulary()[:-1] + ["blank"], "vocabulary blank", "none"),
    (NEMO_META, cm.vocabulary()[1:], "vocabulary", "11"),
    (NEMO_META, ["a b"] + cm.vocabulary()[1:], "vocabulary symbols", "['a b']"),
    (dict(NEMO_META, vocab_size="13"), cm.vocabulary(), "metadata 'vocab_size'", "'13'"),
])
def test_nemo_metadata_and_vocabulary_rules(metadata, vocabulary, what, got, conformer_nemo):
    inputs, outputs = cm.nemo_specs()
    proto = onnx.ModelProto.FromString(conformer_nemo[1].SerializeToString())
    with pytest.raises(ContractError) as err:
        apply_contract(NEMO, proto, inputs, outputs, vocabulary=vocabulary, metadata=metadata)
    assert (err.value.what, err.value.got) == (what, got), err.value
    assert not any(p.key == "vocab_size" for p in proto.metadata_props)  # nothing set on a refusal


def test_without_the_contract_sherpa_onnx_ends_the_process(conformer_nemo, tmp_path):
    """What the metadata check saves a user from: a missing key is an exit, not an exception."""
    pytest.importorskip("sherpa_onnx")
    path = os.path.join(tmp_path, "bare.onnx")
    onnx.save(conformer_nemo[1], path)
    (tmp_path / "tokens.txt").write_text("".join(f"{s} {i}\n" for i, s in enumerate(cm.vocabulary())))
    code = ("import sys, sherpa_onnx; sherpa_onnx.OfflineRecognizer.from_nemo_ctc(model=sys.argv[1], "
            "tokens=sys.argv[2], feature_dim=20)")
    with pytest.raises(ConsumerMismatch, match="exit code 255: .*'vocab_size' does not exist in the metadata"):
        run_child(code, [path, str(tmp_path / "tokens.txt")], "sherpa-onnx")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_speaker_embedding_matches_pytorch_in_sherpa_onnx(exporter, tmp_path):
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("kaldi_native_fbank")
    inputs, outputs = cm.speaker_specs()
    model = cm.SpeakerNet().eval()
    proto = _exported(model, inputs, outputs, tmp_path, exporter)
    for meta in ({"framework": "wespeaker", "sample_rate": "16000", "normalize_samples": "0", "language": "English"},
                 {"framework": "3d-speaker", "sample_rate": "16000", "normalize_samples": "1", "language": "Chinese",
                  "feature_normalize_type": "global-mean"}):
        applied = apply_contract(SPEAKER, proto, inputs, outputs, metadata=meta)
        assert applied.metadata["output_dim"] == "16"
        (check,) = applied.verify_in_consumer(proto, model, inputs)
        assert check["ok"] and check["max_abs_err"] < 1e-4, check


@pytest.mark.parametrize("change, what, got", [
    ({"framework": "nemo"}, "metadata 'framework' (which extractor runs it)", "'nemo'"),
    ({"language": None}, "metadata 'language' (informational, but required)", "missing"),
    ({"normalize_samples": "yes"}, "metadata 'normalize_samples' (1: samples in [-1, 1]; 0: times 32768)", "'yes'"),
    ({"output_dim": "17"}, "metadata 'output_dim'", "'17'"),
])
def test_speaker_embedding_rules(change, what, got, speaker_net):
    inputs, outputs = cm.speaker_specs()
    proto = onnx.ModelProto.FromString(speaker_net[1].SerializeToString())
    meta = {"framework": "wespeaker", "sample_rate": "16000", "normalize_samples": "1", "language": "English"}
    meta = {k: v for k, v in dict(meta, **change).items() if v is not None}
    with pytest.raises(ContractError) as err:
        apply_contract(SPEAKER, proto, inputs, outputs, metadata=meta)
    assert (err.value.what, err.value.got) == (what, got), err.value


def test_speaker_embedding_needs_80_bins_and_one_input():
    batch, time = conformer.Dim("batch"), conformer.Dim("time")
    from onnx_compat import TensorSpec
    with pytest.raises(ContractError, match="inputs: expected 1 .features., got 2"):
        check_specs(SPEAKER, [TensorSpec("fbank", [batch, time, 80], lengths=[1])], cm.speaker_specs()[1])


def test_rasr_is_a_contract(tmp_path):
    """RASR's existing check, through the same entry point: the BLSTM fits the feature scorer; int64 lengths do not."""
    job = blstm.build(features=20, classes=10, hidden=16)
    proto = _quick(job["model"], job["inputs"], job["outputs"], tmp_path)
    applied = apply_contract("rasr", proto, job["inputs"], job["outputs"])
    assert applied.notes == ["RASR roles: feature-scorer, encoder"]
    inputs = [conformer.TensorSpec("data", job["inputs"][0].dims, lengths=[1], lengths_dtype=torch.int64)]
    proto64 = _quick(job["model"], inputs, job["outputs"], tmp_path)
    with pytest.raises(ContractError, match="features-size 'data:size1': dtype must be int32, is int64"):
        apply_contract("rasr", proto64, inputs, job["outputs"])



@pytest.mark.parametrize("seed", [0, 1])
def test_ceil_subsampling_is_refused_whatever_the_weights(seed, tmp_path):
    """NeMo's "ceil" subsampling (⌈T/4⌉ frames) hands sherpa-onnx one frame more than it decodes (⌊T/4⌋) at
    most lengths: refused from the frame counts alone, for any weights, with the fix in the message."""
    inputs, outputs = cm.nemo_specs()
    model = cm.conformer_ctc(right_pad=6, seed=seed)  # (T + 6 - 3) // 4 == ceil(T / 4)
    proto = _quick(model, inputs, outputs, tmp_path)
    with pytest.raises(ContractError) as err:
        apply_contract(NEMO, proto, inputs, outputs, vocabulary=cm.vocabulary(), metadata=NEMO_META)
    assert err.value.what == "output 0 frames" and "9 at T=33 (decodes 8)" in err.value.got, err.value
    assert "floor_frames(model, 4)" in str(err.value), err.value


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_floor_frames_makes_ceil_subsampling_decode_in_sherpa_onnx(exporter, tmp_path):
    """The offered fix: the graph hands sherpa-onnx exactly T // 4 frames (and lengths no longer than that),
    verified against the wrapped eager model at unseen sizes and decoded in sherpa-onnx like PyTorch."""
    from onnx_compat.contracts.sherpa_onnx import floor_frames
    inputs, outputs = cm.nemo_specs()
    wrapped = floor_frames(cm.conformer_ctc(right_pad=6), 4)
    features, lengths = torch.randn(2, 20, 33), torch.tensor([33, 30])
    with torch.no_grad():
        log_probs, out_lengths = wrapped(features, lengths)
    assert log_probs.shape[1] == 8 and out_lengths.tolist() == [8, 7]
    path = str(tmp_path / "model.onnx")
    report = export(wrapped, path, inputs, outputs, exporter=exporter, contract=NEMO, vocabulary=cm.vocabulary(),
                    metadata=NEMO_META)
    assert report.verified_elsewhere() >= 2
    checks = report.contract["consumer_checks"]
    if pytest.importorskip("sherpa_onnx") and checks[0].get("skipped") is None:
        assert checks[0]["ok"] and min(checks[0]["tokens"]) >= 3, checks


def test_a_contract_lists_every_finding_at_once(conformer_nemo):
    """A bad metadata value and a missing vocabulary: both in one ContractError, not one after the other."""
    inputs, outputs = cm.nemo_specs()
    proto = onnx.ModelProto.FromString(conformer_nemo[1].SerializeToString())
    with pytest.raises(ContractError) as err:
        apply_contract(NEMO, proto, inputs, outputs, vocabulary=None, metadata={"normalize_type": "all_features"})
    assert [f.what for f in err.value.findings] == [
        "metadata 'normalize_type' (how sherpa-onnx normalizes the features)", "vocabulary"], err.value
    assert "'all_features'" in str(err.value) and "none (export(..., vocabulary=[...]))" in str(err.value)
