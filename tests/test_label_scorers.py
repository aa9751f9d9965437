"""export_label_scorer: RASR's label-scorer graphs, its loader emulated, proven by decoding like PyTorch.

The bundled AED (Conformer + LSTM decoder with attention, ``stateful-onnx``),
its CTC head (``no-context-onnx``), the LSTM transducer
(``stateful-transducer-onnx``, RASR's open PR) and the stateless transducer
(``fixed-context-onnx``) are exported; the folder must hold graphs RASR's
loader accepts, a config fragment naming every io-map entry, and decodes
through the graphs (called as RASR calls them) equal to PyTorch's, on an
utterance of the example's length, one four times longer and one of a single
encoder frame. The models' own greedy decodes are the independent reference.
Each bad input of the issue is one error naming graph, tensor and rule, with
nothing written.
"""
from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnx
import pytest
import torch
from helpers import needs_dynamo

from onnx_compat import Dim, TensorSpec
from onnx_compat.label_scorers import DecodeMismatch, LabelScorerError, export_label_scorer
from onnx_compat.label_scorers import config, loader
from onnx_compat.models import aed, transducer
from onnx_compat.parts import GraphContractError
from onnx_compat.streaming import StateSpec

HYPS = Dim("hyps")
AED_VOCAB = ["</s>"] + [f"l{i}" for i in range(1, 10)]
RNNT_VOCAB = [f"l{i}" for i in range(11)] + ["<blank>"]


def _features_of(report, seed=0):
    """The utterances the proof decoded (its generator, its lengths)."""
    gen = np.random.default_rng(seed)
    lengths = []
    for d in report.decodes:
        if d["feature_frames"] not in lengths:
            lengths.append(d["feature_frames"])
    return [torch.from_numpy(gen.standard_normal((1, n, 20)).astype(np.float32)) for n in lengths]


def aed_job(model, **overrides):
    job = dict(kind="stateful", encoder=model.encode, features=TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20],
               lengths=[1]), encoder_dim=32, initial=model.initial_states, update=model.step, score=model.log_probs,
               states=[StateSpec("h", [1, HYPS, 32]), StateSpec("c", [1, HYPS, 32]), StateSpec("context", [HYPS, 32])],
               scorer_states=["h", "context"], vocabulary=AED_VOCAB, sentence_end=0)
    job.update(overrides)
    return job


def rnnt_job(model, feat, **overrides):
    L, P = model.layers, model.pred_dim
    job = dict(kind="transducer", release="transducer-pr", encoder=model.encode, features=feat, encoder_dim=32,
               initial=model.initial_states, update=model.predict, score=model.score,
               states=[StateSpec("h", [L, HYPS, P]), StateSpec("c", [L, HYPS, P]), StateSpec("out", [HYPS, P])],
               updater_states=["h", "c"], scorer_states=["out"], vocabulary=RNNT_VOCAB, blank=model.blank)
    job.update(overrides)
    return job


def _io(path):
    proto = onnx.load(path)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(proto.graph.input) + list(proto.graph.output)}
    return dims, {p.key: p.value for p in proto.metadata_props if p.key in dims}


def _check_proof(report, searches):
    lengths = sorted({(d["feature_frames"], d["encoder_frames"]) for d in report.decodes})
    # one frame; the encoder's export example (37 feature frames); 4x that and 4x the decoder graphs' 16 frames
    assert len(lengths) == 3 and lengths[0][1] == 1 and lengths[-1][0] >= 4 * 37 and lengths[-1][1] >= 64, lengths
    assert {d["search"] for d in report.decodes} == set(searches)
    assert all(abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-2 for d in report.decodes)
    assert report.rows_checked > 0 and report.row_max_abs_err <= 1e-5
    long = [d for d in report.decodes if d["encoder_frames"] >= 64]
    assert all(len(set(d["labels"])) >= 2 for d in long), long  # varied decodes, not one label or none
    written = json.load(open(report.files["report"]))
    assert written["decodes"] == report.decodes and written["config"] == report.config


@pytest.fixture(scope="module")
def rnnt(tmp_path_factory):
    model, feat = transducer.tiny()
    folder = str(tmp_path_factory.mktemp("rnnt") / "scorer")
    return model, export_label_scorer(folder, exporter="torchscript", **rnnt_job(model, feat))


def test_transducer_graphs_config_and_decodes(rnnt):
    model, report = rnnt
    L, P = model.layers, model.pred_dim
    init, init_meta = _io(report.files["state-initializer"])
    upd, upd_meta = _io(report.files["state-updater"])
    scorer, scorer_meta = _io(report.files["scorer"])
    assert init == {"h": [1, L, P], "c": [1, L, P], "out": [1, P]}  # no inputs; LSTM states batch first
    assert init_meta == {"h": "h", "c": "c", "out": "out"}
    assert upd["token"] == ["hyps"] and upd["h_in"] == ["hyps", L, P] and upd["out"] == ["hyps", P]
    assert upd_meta == {"h_in": "h", "c_in": "c", "h_out": "h", "c_out": "c", "out": "out"}
    assert scorer == {"input_feature": [1, 32], "out": ["hyps", P], "scores": ["hyps", len(RNNT_VOCAB)]}
    assert scorer_meta == {"out": "out"}
    for graph, meta in (("state-initializer", init_meta), ("state-updater", upd_meta), ("scorer", scorer_meta)):
        step = report.steps[graph]["rasr-label-scorer"]  # the per-graph deployment step wrote and checked it
        assert step["states"] == meta and step["checked"][0] == "validator", (graph, step)
    values = config.parse(open(report.files["label-scorer.config"]).read())
    assert values["decoder.type"] == "stateful-transducer-onnx"
    assert values["decoder.state-updater-model.io-map.token"] == "token"
    assert values["decoder.scorer-model.io-map.input-feature"] == "input_feature"
    assert values["encoder.onnx-model.io-map.features-size"] == "features:size1"
    assert values["decoder.scorer-model.session.file"] == report.files["scorer"]
    searches = [f"{b}, time-synchronous, labels {v} the frame" for b in ("greedy", "beam 4")
                for v in ("stay on", "consume")]
    _check_proof(report, searches)
    for x in _features_of(report):  # the model's own greedy decode agrees with the graphs'
        for vertical in (True, False):
            name = f"greedy, time-synchronous, labels {'stay on' if vertical else 'consume'} the frame"
            got = next(d["labels"] for d in report.decodes if d["search"] == name and d["feature_frames"] == x.shape[1])
            assert got == model.greedy_decode(x, vertical=vertical), (x.shape, vertical)


def test_aed_stateful_onnx(tmp_path):
    model = aed.tiny()
    report = export_label_scorer(str(tmp_path / "aed"), exporter="torchscript", **aed_job(model))
    upd, upd_meta = _io(report.files["state-updater"])
    assert upd["encoder_states"] == [1, "frames", 32] and upd["encoder_states:size1"] == [1]  # batch 1, broadcast inside
    assert upd["h_in"] == ["hyps", 1, 32] and upd["context_in"] == ["hyps", 32]
    _, scorer_meta = _io(report.files["scorer"])
    assert scorer_meta == {"h": "h", "context": "context"}
    values = config.parse(report.config)
    for graph in ("state-initializer", "state-updater"):
        assert values[f"decoder.{graph}-model.io-map.encoder-states-size"] == "encoder_states:size1"
    _check_proof(report, ["greedy, label-synchronous", "beam 4, label-synchronous"])
    for x in _features_of(report):
        frames = next(d["encoder_frames"] for d in report.decodes if d["feature_frames"] == x.shape[1])
        got = next(d["labels"] for d in report.decodes
                   if d["search"] == "greedy, label-synchronous" and d["feature_frames"] == x.shape[1])
        assert got == model.greedy_decode(x, max_labels=2 * frames)


def test_ctc_head_no_context_and_stateless_transducer_fixed_context(tmp_path):
    model = aed.tiny()
    ctc = export_label_scorer(str(tmp_path / "ctc"), kind="ctc", encoder=model.encode, encoder_dim=32,
                              features=aed_job(model)["features"], score=model.ctc_log_probs,
                              vocabulary=AED_VOCAB + ["<blank>"], blank=10, exporter="torchscript")
    assert config.parse(ctc.config)["decoder.type"] == "no-context-onnx"
    assert _io(ctc.files["scorer"])[0]["scores"] == ["hyps", 11]
    assert {d["search"] for d in ctc.decodes} == {"greedy, time-synchronous", "beam 4, time-synchronous"}
    stateless, feat = transducer.tiny_stateless(context=2)
    fixed = export_label_scorer(str(tmp_path / "fixed"), kind="fixed-context", encoder=stateless.encode, features=feat,
                                encoder_dim=32, score=stateless.score, vocabulary=RNNT_VOCAB, blank=stateless.blank,
                                history=2, start_label=stateless.blank, exporter="torchscript")
    values = config.parse(fixed.config)
    assert values["decoder.history-length"] == "2" and values["decoder.onnx-model.io-map.history"] == "history"
    assert _io(fixed.files["scorer"])[0]["history"] == ["hyps", 2]
    for x in _features_of(fixed):
        got = next(d["labels"] for d in fixed.decodes if d["search"].startswith("greedy") and "stay on" in d["search"]
                   and d["feature_frames"] == x.shape[1])
        assert got == stateless.greedy_decode(x)


@needs_dynamo
def test_transducer_with_dynamo(tmp_path):
    model, feat = transducer.tiny()
    report = export_label_scorer(str(tmp_path / "rnnt"), exporter="dynamo", **rnnt_job(model, feat))
    assert {g["exporter"] for g in report.graphs.values()} == {"dynamo"}
    assert any(len(d["labels"]) > 5 for d in report.decodes)


@needs_dynamo
def test_ctc_head_and_fixed_context_scorers_with_dynamo(tmp_path):
    """The no-context (CTC head) and fixed-context (int32 history) scorer graphs under dynamo, decoded through
    as RASR calls them; their encoders stay on TorchScript (the bundled Conformer's dynamo export is tested
    elsewhere and costs most of a minute)."""
    model = aed.tiny()
    ctc = export_label_scorer(str(tmp_path / "ctc"), kind="ctc", encoder=model.encode, encoder_dim=32,
                              features=aed_job(model)["features"], score=model.ctc_log_probs,
                              vocabulary=AED_VOCAB + ["<blank>"], blank=10,
                              exporter={"encoder": "torchscript", "scorer": "dynamo"})
    assert ctc.graphs["scorer"]["exporter"] == "dynamo"
    assert {d["search"] for d in ctc.decodes} == {"greedy, time-synchronous", "beam 4, time-synchronous"}
    assert any(len(d["labels"]) > 2 for d in ctc.decodes)
    stateless, feat = transducer.tiny_stateless(context=2)
    fixed = export_label_scorer(str(tmp_path / "fixed"), kind="fixed-context", encoder=stateless.encode, features=feat,
                                encoder_dim=32, score=stateless.score, vocabulary=RNNT_VOCAB, blank=stateless.blank,
                                history=2, start_label=stateless.blank,
                                exporter={"encoder": "torchscript", "scorer": "dynamo"})
    assert fixed.graphs["scorer"]["exporter"] == "dynamo"
    for x in _features_of(fixed):
        got = next(d["labels"] for d in fixed.decodes if d["search"].startswith("greedy") and "stay on" in d["search"]
                   and d["feature_frames"] == x.shape[1])
        assert got == stateless.greedy_decode(x)


# --- bad input: one error each, nothing written -------------------------------------------------------

def _refused(tmp_path, job, error=LabelScorerError):
    with pytest.raises(error) as info:
        export_label_scorer(str(tmp_path / "out"), exporter="torchscript", **job)
    assert not os.path.exists(tmp_path / "out") and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    return info.value


def test_int64_lengths_refused(tmp_path):
    model = aed.tiny()
    feat = TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20], lengths=[1], lengths_dtype=torch.int64)
    err = _refused(tmp_path, aed_job(model, features=feat))
    assert (err.graph, err.tensor, err.rule) == ("encoder", "features:size1", "dtype exactly as specified")


def test_state_batch_not_movable_refused(tmp_path):
    model = aed.tiny()
    job = aed_job(model)
    job["states"][2] = StateSpec("context", [1, 32])
    err = _refused(tmp_path, job)
    assert err.tensor == "context" and "batch" in str(err)


def test_state_growing_with_history_refused(tmp_path):
    """A named dim is measured: one that is neither the encoder frames nor growing is told its size; one that
    grows after an update is refused as growing, with the sizes measured (issue 46, Deliver 1)."""
    model = aed.tiny()
    job = aed_job(model)
    job["states"][2] = StateSpec("context", [HYPS, Dim("labels")])
    err = _refused(tmp_path, job)
    assert err.tensor == "context" and err.rule == "state non-batch dims static or the encoder frames"
    assert "declare it as the int 32" in str(err) and "grows" not in str(err)

    def growing(token, enc, lengths, h, c, context):  # a history that gets one longer per label
        h, c, ctx = model.step(token, enc, lengths, h, c, context[:, :32])
        return h, c, torch.cat([ctx, context], -1)
    for declared in (32, Dim("labels")):
        job = aed_job(model, update=growing, module=model)
        job["states"][2] = StateSpec("context", [HYPS, declared])
        err = _refused(tmp_path, job)
        assert err.tensor == "context" and err.rule == "state non-batch dims static"
        assert "grows with the label history (measured: dim 1 is 32 after the initializer, 64 after one update)" \
            in str(err)


def test_log_probs_declared_as_costs_refused(tmp_path):
    err = _refused(tmp_path, aed_job(aed.tiny(), scores="costs"))
    assert (err.graph, err.rule) == ("scorer", "scores are costs") and "log-probs" in str(err)


def test_vocabulary_size_refused(tmp_path):
    err = _refused(tmp_path, aed_job(aed.tiny(), vocabulary=AED_VOCAB[:-1]))
    assert (err.graph, err.tensor, err.rule) == ("scorer", "scores", "scores as wide as the vocabulary")


def test_parts_ignoring_token_or_state_named(tmp_path):
    model = aed.tiny()

    def deaf(token, enc, lengths, h, c, context):
        return model.step(torch.zeros_like(token), enc, lengths, h, c, context)
    err = _refused(tmp_path, aed_job(model, update=deaf, module=model), GraphContractError)
    assert (err.graph, err.tensor) == ("state-updater", "token")

    def blind(h, context):
        return model.log_probs(h, torch.zeros_like(context))
    err = _refused(tmp_path, aed_job(model, score=blind, module=model), GraphContractError)
    assert (err.graph, err.tensor) == ("scorer", "context")


def test_transducer_on_master_and_fp16_state_refused(tmp_path):
    model, feat = transducer.tiny()
    err = _refused(tmp_path, rnnt_job(model, feat, release="master"))
    assert err.rule == "type in release" and "fixed-context" in str(err)
    job = rnnt_job(model, feat)
    job["states"][2] = StateSpec("out", [HYPS, model.pred_dim], torch.float16)
    err = _refused(tmp_path, job)
    assert (err.tensor, err.rule) == ("out", "state dtype concatenable")


def test_hypotheses_leaking_into_each_other_refused(tmp_path):
    model, feat = transducer.tiny()

    def leaky(frame, out):  # every row also sees the batch's mean: fine in PyTorch's batch, wrong in RASR's
        return model.score(frame, out + out.mean(0, keepdim=True))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    err = _refused(tmp_path, rnnt_job(model, feat, score=leaky, module=model))  # every graph exported, then refused
    assert err.rule == "rows independent" and err.graph == "scorer"
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not model.training  # the model as it was


def test_loader_emulation_names_graph_tensor_rule(rnnt):
    _, report = rnnt
    values = config.parse(report.config)
    protos = {g: onnx.load(report.files[g]) for g in ("encoder", "state-initializer", "state-updater", "scorer")}
    assert loader.emulate("transducer", protos, values, len(RNNT_VOCAB)) == []

    def findings(mutate=None, graph=None, values_=values):
        changed = copy.deepcopy(protos)
        if mutate:
            mutate(changed[graph])
        return [(f.graph, f.tensor, f.rule) for f in loader.emulate("transducer", changed, values_, len(RNNT_VOCAB))]

    def int64_token(p):
        p.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    assert ("state-updater", "token", "dtype exactly as specified") in findings(int64_token, "state-updater")

    def static_batch(p):
        dim = next(v for v in p.graph.output if v.name == "scores").type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = 1
    assert ("scorer", "scores", "rank and dims as specified") in findings(static_batch, "scorer")

    def stray_state(p):
        p.metadata_props.add(key="out", value="pred")
    assert ("scorer", "out", "scorer states are initializer states") in findings(stray_state, "scorer")

    def extra_input(p):
        p.graph.input.append(onnx.helper.make_tensor_value_info("temperature", onnx.TensorProto.FLOAT, [1]))
    assert ("scorer", "temperature", "every input fed") in findings(extra_input, "scorer")
    assert ("state-initializer", "temperature", "transducer initializer without inputs") in \
        findings(extra_input, "state-initializer")

    def wider_state(p):
        v = next(v for v in p.graph.output if v.name == "h")
        v.type.tensor_type.shape.dim[2].dim_value = 99
    assert ("state-updater", "h_in", "state alike in every graph") in findings(wider_state, "state-initializer")
    unmapped = {k: v for k, v in values.items() if not k.endswith("io-map.token")}
    assert ("state-updater", "token", "required entry mapped") in findings(values_=unmapped)


def test_a_decode_that_differs_is_named():
    """The proof itself: two searches over scorers that disagree on one label's cost give a DecodeMismatch
    naming the search and the utterance (the graphs' side here is PyTorch with that label made cheaper)."""
    from onnx_compat.label_scorers.backends import TorchCallables
    from onnx_compat.label_scorers.proof import prove
    model, feat = transducer.tiny()
    job = rnnt_job(model, feat)
    fns = {"encoder": model.encode, "initial": model.initial_states, "update": model.predict, "score": model.score}

    class Skewed(TorchCallables):
        def _score(self, states, t):
            costs = super()._score(states, t)
            costs[:, 3] -= 5.0
            return costs

    args = (job["states"], job["updater_states"], job["scorer_states"], "hyps", True, {})
    features = [np.random.default_rng(0).standard_normal((1, 20, 20)).astype(np.float32)]
    with pytest.raises(DecodeMismatch) as info:
        prove("transducer", Skewed("transducer", fns, *args), TorchCallables("transducer", fns, *args), features,
              beam=4, blank=model.blank, sentence_end=None)
    assert "greedy" in str(info.value) and "20 feature frames" in str(info.value)
    assert info.value.rule == "decode as PyTorch"


def test_the_label_scorer_verb(tmp_path, capsys):
    from onnx_compat.cli import main
    out = tmp_path / "ctc"
    assert main(["label-scorer", "onnx_compat.models.aed:ctc_label_scorer_job", "--out", str(out),
                 "--exporter", "torchscript", "--beam", "4"]) == 0
    printed = capsys.readouterr().out
    assert "no-context-onnx" in printed and "equal to PyTorch's" in printed
    assert sorted(os.listdir(out)) == ["encoder.onnx", "label-scorer.config", "report.json", "scorer.onnx"]
    assert main(["label-scorer", "onnx_compat.models.aed:no_such_job", "--out", str(tmp_path / "x")]) == 2
    assert main(["label-scorer", "onnx_compat.models.aed:ctc_label_scorer_job", "--out", str(tmp_path / "y"),
                 "--utterances", "7,x"]) == 2
    assert "usage error" in capsys.readouterr().err and not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
