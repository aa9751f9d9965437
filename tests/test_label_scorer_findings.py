"""Issue 45's label-scorer findings (3, 4, 6-10, 13, 14) and issue 46's Deliver 1, each a test that failed before
its fix.

Most refusals come before any export, so they cost a rehearsal. The exports use a linear CTC model (two tiny
graphs, TorchScript) except the i6-style AED of Deliver 1, exported with both exporters and decoded through the
written graphs to PyTorch's labels.
"""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch
from helpers import needs_dynamo
from torch import nn

from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import OnnxCompatError
from onnx_compat.label_scorers import LabelScorerError, config, export_label_scorer, loader
from onnx_compat.label_scorers.backends import _concat
from onnx_compat.label_scorers.proof import check_decoded
from onnx_compat.models import aed, i6_aed
from onnx_compat.streaming import StateSpec
from test_label_scorers import HYPS, aed_job

CTC_VOCAB = ["a", "b", "c", "d", "e", "<blank>"]


class LinearCTC(nn.Module):
    """A frame-wise encoder (no subsampling: T' = T) and a CTC head, small enough to export in a second."""

    def __init__(self, blank_bias: float = 0.0, pad: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.head, self.pad = nn.Linear(20, 8), nn.Linear(8, len(CTC_VOCAB)), pad
        with torch.no_grad():
            self.head.weight.mul_(4)
            self.head.bias[-1] += blank_bias
        self.eval()

    def encode(self, x, lengths):
        frames = torch.tanh(self.proj(x))
        return nn.functional.pad(frames, (0, 0, 0, self.pad)) if self.pad else frames, lengths

    def log_probs(self, frame):
        return self.head(frame).log_softmax(-1)


def ctc_job(model, **overrides):
    job = dict(kind="ctc", encoder=model.encode, score=model.log_probs, encoder_dim=8, vocabulary=CTC_VOCAB,
               blank=5, features=TensorSpec("features", [Dim("batch"), Dim("time"), 20], lengths=[1]),
               utterances=[9, 40, 1], module=model, exporter="torchscript")
    job.update(overrides)
    return job


def refused(tmp_path, job, error=LabelScorerError, name="out"):
    """The export refused with ``error`` and nothing left behind (no folder, no temporary file)."""
    before = set(os.listdir(tmp_path))
    with pytest.raises(error) as info:
        export_label_scorer(str(tmp_path / name), **job)
    assert isinstance(info.value, OnnxCompatError)
    assert set(os.listdir(tmp_path)) == before, set(os.listdir(tmp_path)) - before
    return info.value


# --- finding 3: logits, probabilities and costs declared as log-probs --------------------------------------

@pytest.mark.parametrize("declared, returned, advice", [
    ("log-probs", lambda m, f: m.head(f), "return logits.log_softmax(-1)"),
    ("log-probs", lambda m, f: m.head(f).softmax(-1), "return their log"),
    ("log-probs", lambda m, f: -m.head(f).log_softmax(-1), "pass scores='costs'"),
    ("costs", lambda m, f: m.head(f), "return -logits.log_softmax(-1)"),
    ("costs", lambda m, f: m.head(f).softmax(-1), "return -log of them"),
    ("costs", lambda m, f: m.head(f).log_softmax(-1), "pass scores='log-probs'"),
])
def test_scores_not_normalized_refused_with_the_measured_advice(tmp_path, declared, returned, advice):
    model = LinearCTC()
    err = refused(tmp_path, ctc_job(model, scores=declared, score=lambda f: returned(model, f)))
    assert (err.graph, err.tensor, err.rule) == ("scorer", "scores", "scores are costs")
    assert advice in str(err) and "log-sum-exp" in str(err), str(err)


# --- finding 4: values RASR's configuration would not read back ---------------------------------------------

@pytest.mark.parametrize("folder, features, culprit", [
    ("out#1", "features", "folder"), ("out 1", "features", "folder"), ("out", "$(features)", "$(features)")])
def test_rasr_config_values_refused(tmp_path, folder, features, culprit):
    model = LinearCTC()
    job = ctc_job(model, features=TensorSpec(features, [Dim("batch"), Dim("time"), 20], lengths=[1]))
    err = refused(tmp_path, job, name=folder)
    assert (err.tensor, err.rule) == (culprit, "RASR config value")
    assert ("'#'" if "#" in folder else "whitespace" if " " in folder else "'$('") in str(err)


def test_fragment_parser_reads_a_hash_as_a_comment():
    """Why '#' is refused: the fragment, read back as RASR reads it, loses the rest of the value."""
    assert config.parse("[*.label-scorer]\nencoder.onnx-model.session.file = out/f#1/encoder.onnx\n") == \
        {"encoder.onnx-model.session.file": "out/f"}


# --- finding 6: padding frames at batch 1 -----------------------------------------------------------------

def test_encoder_lengths_shorter_than_frames_at_batch_1_refused(tmp_path):
    err = refused(tmp_path, ctc_job(LinearCTC(pad=2)))
    assert (err.graph, err.tensor, err.rule) == ("encoder", "outputs", "batch-1 frames all valid")
    assert "2 padding frame(s) would be decoded" in str(err)


# --- finding 7: a proof that decoded nothing ----------------------------------------------------------------

def test_a_proof_that_decoded_nothing_is_refused(tmp_path):
    err = refused(tmp_path, ctc_job(LinearCTC(blank_bias=50.0)))  # blank wins every frame
    assert (err.graph, err.rule) == ("scorer", "proof decodes labels") and "every one of the" in str(err)


def test_a_proof_of_one_label_is_noted():
    one = [{"labels": [3, 3]}, {"labels": []}]
    assert check_decoded([{"labels": [1, 2]}, {"labels": []}]) == []
    assert "holds the label [3] at most" in check_decoded(one)[0]


# --- finding 8: stale graphs of an earlier export -----------------------------------------------------------

def test_earlier_export_files_removed_and_foreign_graphs_refused(tmp_path):
    folder = tmp_path / "scorer"
    folder.mkdir()
    earlier = {g: str(folder / f"{g}.onnx") for g in ("encoder", "state-initializer", "state-updater", "scorer")}
    for path in earlier.values():
        open(path, "wb").close()
    (folder / "mine.txt").write_text("the user's")
    earlier.update({"label-scorer.config": str(folder / "label-scorer.config"), "report": str(folder / "report.json")})
    (folder / "report.json").write_text(json.dumps({"kind": "stateful", "files": earlier}))
    report = export_label_scorer(str(folder), **ctc_job(LinearCTC()))
    assert sorted(os.listdir(folder)) == ["encoder.onnx", "label-scorer.config", "mine.txt", "report.json",
                                          "scorer.onnx"]
    assert sorted(report.removed) == [earlier["state-initializer"], earlier["state-updater"]]
    assert onnx.load(report.files["scorer"]).graph.output[0].name == "scores"
    other = tmp_path / "other"
    other.mkdir()
    (other / "state-updater.onnx").write_bytes(b"not ours")  # no report names it: maybe the user's
    err = refused(tmp_path, ctc_job(LinearCTC()), name="other")
    assert (err.tensor, err.rule) == ("state-updater.onnx", "folder holds no stale graphs")
    assert (other / "state-updater.onnx").read_bytes() == b"not ours"


# --- finding 9: a state declared with the wrong shape -------------------------------------------------------

@pytest.mark.parametrize("dims, said", [([1, HYPS, 40], "dim 2 is 32, declared 40"),
                                        ([2, HYPS, 32], "dim 0 is 1, declared 2"),
                                        ([1, HYPS, 32, 1], "rank 3, declared 4")])
def test_wrong_state_shape_named_by_what_was_measured(tmp_path, dims, said):
    job = aed_job(aed.tiny())
    job["states"][0] = StateSpec("h", dims)
    err = refused(tmp_path, job)
    assert (err.graph, err.tensor, err.rule) == ("state-initializer", "h", "states as declared")
    assert said in str(err) and "returns state 'h' as [1, 1, 32] at 1 hypothesis" in str(err)
    assert "grows" not in str(err) and "state-managed" not in str(err)


# --- finding 10: train mode, and callables that draw --------------------------------------------------------

def test_train_mode_and_random_callables_named(tmp_path):
    model = aed.tiny().train()
    err = refused(tmp_path, aed_job(model))
    assert (err.tensor, err.rule) == ("module", "module in eval mode") and "model.eval()" in str(err)
    model.eval()

    def dropped(h, context):
        return model.log_probs(nn.functional.dropout(h, 0.5, training=True), context)
    err = refused(tmp_path, aed_job(model, score=dropped, module=model))
    assert (err.graph, err.rule) == ("scorer", "deterministic callables") and "random" in str(err)


# --- finding 13: errors of the user's callables named as the argument ---------------------------------------

def test_wrong_feature_dim_and_bad_utterances_named(tmp_path):
    model = aed.tiny()
    feat = TensorSpec("features", [Dim("batch"), Dim("time", min=7), 80], lengths=[1])
    err = refused(tmp_path, aed_job(model, features=feat))
    assert (err.graph, err.tensor, err.rule) == ("encoder", "features", "encoder runs on the declared features")
    assert "F=80" in str(err)
    for utterances in ([0], [37, 3], "37"):
        err = refused(tmp_path, aed_job(model, utterances=utterances))
        assert (err.tensor, err.rule) == ("utterances", "utterances the proof decodes"), (utterances, str(err))


def test_features_without_lengths_exported(tmp_path):
    """An encoder whose features declare no lengths gets the full length (RASR feeds no features-size)."""
    model = LinearCTC()
    report = export_label_scorer(str(tmp_path / "ctc"), **ctc_job(
        model, features=TensorSpec("features", [Dim("batch"), Dim("time"), 20])))
    assert [i.name for i in onnx.load(report.files["encoder"]).graph.input] == ["features"]
    assert "features-size" not in report.config
    gen = np.random.default_rng(0)  # the proof's utterances, drawn in order: 9, then 40 feature frames
    gen.standard_normal((1, 9, 20))
    x = torch.from_numpy(gen.standard_normal((1, 40, 20)).astype(np.float32))
    best = model.log_probs(model.encode(x, None)[0])[0].argmax(-1).tolist()
    want = [v for v in best if v != 5]  # RASR's time-synchronous search without label loops: repeats are labels
    got = next(d["labels"] for d in report.decodes if d["feature_frames"] == 40 and d["search"].startswith("greedy"))
    assert got == want and len(set(want)) >= 2  # the CTC greedy decode of the model itself


# --- finding 14: an id the search does not use ---------------------------------------------------------------

def test_ids_the_search_does_not_use_refused(tmp_path):
    err = refused(tmp_path, aed_job(aed.tiny(), blank=3))
    assert (err.tensor, err.rule) == ("blank", "ids the search uses") and "label-synchronous" in str(err)
    err = refused(tmp_path, ctc_job(LinearCTC(), sentence_end=0))
    assert (err.tensor, err.rule) == ("sentence_end", "ids the search uses")


# --- issue 46, Deliver 1: a state sized by the encoder frames -------------------------------------------------

def _check_i6(model, report):
    init = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in onnx.load(report.files["state-initializer"]).graph.output}
    upd = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
           for v in onnx.load(report.files["state-updater"]).graph.input}
    assert init["accum_att_weights"] == [1, "frames", 1]
    assert upd["accum_att_weights_in"] == ["hyps", "frames", 1] and upd["encoder_states"] == [1, "frames", 49]
    assert "token_embedding_in" not in upd  # the updater does not read it, as i6's
    values = config.parse(report.config)
    assert values["decoder.state-updater-model.io-map.encoder-states-size"] == "encoder_states:size1"
    assert {d["search"] for d in report.decodes} == {"greedy, label-synchronous", "beam 4, label-synchronous"}
    frames = sorted({d["encoder_frames"] for d in report.decodes})
    assert frames[0] == 1 and frames[-1] >= 64 and report.rows_checked > 0 and report.row_max_abs_err <= 1e-5
    gen = np.random.default_rng(0)
    lengths = []
    for d in report.decodes:
        if d["feature_frames"] not in lengths:
            lengths.append(d["feature_frames"])
    for n in lengths:  # the model's own greedy decode, on the proof's utterances
        x = torch.from_numpy(gen.standard_normal((1, n, 20)).astype(np.float32))
        d = next(d for d in report.decodes if d["feature_frames"] == n and d["search"].startswith("greedy"))
        assert d["labels"] == model.greedy_decode(x, max_labels=2 * d["encoder_frames"]), n
        assert abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-4
    assert any(len(set(d["labels"])) >= 3 for d in report.decodes if d["encoder_frames"] >= 64)
    assert report.notes == []


@pytest.fixture(scope="module")
def i6(tmp_path_factory):
    job = i6_aed.label_scorer_job()
    folder = str(tmp_path_factory.mktemp("i6") / "scorer")
    return job["module"], export_label_scorer(folder, exporter="torchscript", **job)


def test_i6_aed_accumulated_attention_weights_torchscript(i6):
    _check_i6(*i6)


def test_frames_sized_state_in_the_loader_emulation(i6):
    """The emulation accepts a state dim that is the encoder frames' symbol and refuses any other symbol;
    RASR's concat of hypotheses whose states differ past the batch is refused as RASR aborts."""
    _, report = i6
    protos = {g: onnx.load(report.files[g]) for g in ("encoder", "state-initializer", "state-updater", "scorer")}
    values = config.parse(report.config)
    assert loader.emulate("stateful", protos, values, len(i6[0].readout.bias)) == []
    value = next(v for v in protos["state-updater"].graph.input if v.name == "accum_att_weights_in")
    value.type.tensor_type.shape.dim[1].dim_param = "labels"
    found = [(f.graph, f.tensor, f.rule) for f in loader.emulate("stateful", protos, values, 10)]
    assert ("state-updater", "accum_att_weights_in", "state non-batch dims static") in found
    with pytest.raises(LabelScorerError) as info:
        _concat("state-updater", "accum_att_weights_in", [np.zeros((1, 8, 1), np.float32), np.zeros((1, 9, 1), np.float32)])
    assert info.value.rule == "state non-batch dims static"


@needs_dynamo
def test_i6_aed_decoder_graphs_with_dynamo(tmp_path):
    """stateful-onnx's decoder graphs under dynamo: the batch-1 encoder states repeated inside, the states
    batch first, the costs, and a state sized by the encoder frames tied to their symbol. (It replaces the
    bundled AED's dynamo test: nn.LSTM's [layers, B, H] moved batch-first under dynamo is the transducer's
    dynamo test. The bundled Conformer encoder stays on TorchScript: its dynamo export costs most of a minute
    on a loaded machine and is tested elsewhere.)"""
    job = i6_aed.label_scorer_job()
    dynamo = {g: "dynamo" for g in ("state-initializer", "state-updater", "scorer")}
    report = export_label_scorer(str(tmp_path / "i6"), exporter={"encoder": "torchscript", **dynamo}, **job)
    assert {g: r["exporter"] for g, r in report.graphs.items()} == {"encoder": "torchscript", **dynamo}
    _check_i6(job["module"], report)


def test_frames_sized_state_is_the_encoder_frames_or_refused(tmp_path):
    """A named dim that is not the encoder frames (here the context, 32) is refused with its measured size."""
    job = i6_aed.label_scorer_job()
    job["states"][1] = StateSpec("att_context", [HYPS, Dim("ctx")])
    err = refused(tmp_path, {**job, "exporter": "torchscript"})
    assert (err.tensor, err.rule) == ("att_context", "state non-batch dims static or the encoder frames")
    assert "measures 32" in str(err)
