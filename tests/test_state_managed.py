"""export_label_scorer(kind="state-managed"): RASR's state-managed-onnx with the transformer and lstm managers.

The bundled Transformer LM, Transformer AED decoder (over the bundled Conformer) and LSTM LM, and the
bundled LSTM attention decoder under the lstm manager, are written and decoded through the graph as RASR
master calls it (its contexts, the managers' left-padded merge and split, the start context, the zero-length
first prefix), greedy and beam 4, against PyTorch; the models' own decodes without any cache are the
independent reference. A batch of hypotheses of prefix lengths 0..5 is compared row by row with each alone,
and a Transformer that does not mask the left padding is refused there. The lstm manager without encoder
states (undefined behaviour in RASR master) is refused, and the same LSTM is written for the transformer
manager instead.
"""
from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import onnx
import pytest
import torch
from helpers import needs_dynamo

from onnx_compat import Dim, TensorSpec
from onnx_compat.label_scorers import LabelScorerError, config, export_label_scorer, managers
from onnx_compat.label_scorers.managed_search import Ctx, ManagedScorer
from onnx_compat.models import aed, lstm_lm, transformer_decoder
from onnx_compat.streaming import StateSpec

HYPS = Dim("hyps")
VOCAB = ["</s>"] + [f"l{i}" for i in range(1, 10)]


def _io(path):
    proto = onnx.load(path)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(proto.graph.input) + list(proto.graph.output)}
    return dims, {p.key: p.value for p in proto.metadata_props if p.key.startswith("STATE_")}


def _greedy(report, frames=None):
    return next(d["labels"] for d in report.decodes if d["search"].startswith("greedy")
                and d.get("encoder_frames") == frames)


@contextlib.contextmanager
def one_thread():
    """The models' own decodes are hundreds of small steps: on one thread, as the proof runs its eager side
    (a loaded 2-core machine makes each step pay the thread pool's wake-up many times over)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _lm_job(model, **overrides):
    job = dict(kind="state-managed", manager="transformer", score=model.step, states=model.state_specs(),
               vocabulary=VOCAB, sentence_end=0, start_label=0)
    job.update(overrides)
    return job


def _features_of(report, seed=0):
    gen = np.random.default_rng(seed)
    lengths = []
    for d in report.decodes:
        if d["feature_frames"] not in lengths:
            lengths.append(d["feature_frames"])
    return [torch.from_numpy(gen.standard_normal((1, n, 20)).astype(np.float32)) for n in lengths]


@pytest.fixture(scope="module")
def transformer_lm(tmp_path_factory):
    model = transformer_decoder.tiny_lm()
    folder = tmp_path_factory.mktemp("lm") / "scorer"
    return model, export_label_scorer(str(folder), exporter="torchscript", **_lm_job(model))


def test_transformer_lm_graph_metadata_config_and_decodes(transformer_lm):
    model, report = transformer_lm
    dims, meta = _io(report.files["scorer"])
    assert dims["token"] == ["hyps", "suffix"] and dims["token:size1"] == ["hyps"]
    assert dims["l0_k_in"] == ["hyps", "prefix", 32] and dims["l0_k_in:size1"] == ["hyps"]
    assert dims["scores"] == ["hyps", "suffix", 10] and dims["l1_v_out"][:2] == ["hyps", "suffix"]
    assert meta == {f"STATE_l{i}_{kv}_in": f"l{i}_{kv}_out" for i in range(2) for kv in "kv"}
    values = config.parse(open(report.files["label-scorer.config"]).read())
    assert values["type"] == "state-managed-onnx" and values["state-manager.type"] == "transformer"
    assert values["start-labels"] == "0" and values["onnx-model.io-map.prefix-length"] == "l0_k_in:size1"
    assert values["onnx-model.io-map.token-length"] == "token:size1"
    assert values["onnx-model.session.file"] == report.files["scorer"]
    # the graph called as RASR calls it decodes as the model does with no cache at all
    assert _greedy(report) == model.greedy_decode(20) and len(set(_greedy(report))) >= 2
    assert {d["search"] for d in report.decodes} == {"greedy, label-synchronous", "beam 4, label-synchronous"}
    assert all(abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-3 for d in report.decodes)
    # hypotheses of prefix lengths 0..5 in one run (left padding), each row equal to it alone
    assert report.mixed_batch["prefix_lengths"] == [0, 1, 2, 3, 4, 5]
    assert report.rows_checked >= 6 and report.row_max_abs_err <= 1e-5
    assert json.load(open(report.files["report"]))["mixed_batch"] == report.mixed_batch


def test_cache_returned_as_prefix_and_suffix(tmp_path):
    """A step returning each cache whole (prefix and suffix): RASR keeps the last position, so it decodes as
    the suffix-only graph does; the output's time dim is then not the suffix's."""
    model = transformer_decoder.tiny_lm()

    def whole(tokens, token_lengths, prefix_lengths, *caches):
        out = model.step(tokens, token_lengths, prefix_lengths, *caches)
        return (out[0], *[torch.cat([c, n], 1) for c, n in zip(caches, out[1:])])

    report = export_label_scorer(str(tmp_path / "whole"), exporter="torchscript", **_lm_job(model, score=whole,
                                                                                          module=model))
    dims, _ = _io(report.files["scorer"])
    assert dims["l0_k_out"][::2] == ["hyps", 32] and dims["l0_k_out"][1] not in ("suffix", "prefix", 1)
    assert _greedy(report) == model.greedy_decode(20) and report.mixed_batch["prefix_lengths"][0] == 0


def test_unmasked_left_padding_is_refused(tmp_path):
    """A Transformer right whenever every hypothesis has the same prefix length (as in a label-synchronous
    decode) but reading RASR's left padding: only the batch of mixed prefix lengths shows it."""
    model = transformer_decoder.tiny_lm(mask_padding=False)
    folder = tmp_path / "broken"
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(folder), exporter="torchscript", **_lm_job(model))
    assert err.value.rule == "rows independent of the batch's padding" and err.value.graph == "scorer"
    assert "batch of prefixes [0, 1, 2, 3, 4, 5]" in str(err.value)
    assert not folder.exists()


def test_lstm_lm_refused_for_the_lstm_manager_and_written_for_the_transformer_manager(tmp_path):
    model = lstm_lm.tiny()
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(tmp_path / "refused"), exporter="torchscript", **_lm_job(model, manager="lstm"))
    assert err.value.rule == "lstm manager needs an encoder input" and "402-404" in str(err.value)
    assert not (tmp_path / "refused").exists()
    report = export_label_scorer(str(tmp_path / "lstm"), exporter="torchscript", **_lm_job(model))
    dims, meta = _io(report.files["scorer"])
    assert dims["h0_in"] == ["hyps", "history", 32] and dims["h0_out"] == ["hyps", 1, 32]
    assert dims["token"] == ["hyps", 1] and dims["token_length"] == ["hyps"] and len(meta) == 4
    values = config.parse(report.config)
    assert values["state-manager.type"] == "transformer" and values["state-manager.max-history"] == "1"
    assert "undefined behaviour" in report.notes[0] and "undefined behaviour" in report.config
    assert _greedy(report) == model.greedy_decode(20) and len(set(_greedy(report))) >= 2
    assert report.mixed_batch["prefix_lengths"][0] == 0 and report.row_max_abs_err <= 1e-5


def test_transformer_aed_decoder_over_the_conformer(tmp_path):
    model = transformer_decoder.tiny_aed()
    report = export_label_scorer(str(tmp_path / "aed"), exporter="torchscript",
                                 **transformer_decoder.label_scorer_job("aed"))
    values = config.parse(report.config)
    assert values["type"] == "encoder-decoder" and values["decoder.type"] == "state-managed-onnx"
    assert values["decoder.onnx-model.io-map.encoder-states"] == "encoder_states"
    assert values["decoder.onnx-model.io-map.encoder-states-size"] == "encoder_states:size1"
    dims, _ = _io(report.files["scorer"])
    assert dims["encoder_states"] == [1, "frames", 32] and dims["encoder_states:size1"] == [1]
    frames = sorted({d["encoder_frames"] for d in report.decodes})
    assert len(frames) == 3 and frames[0] == 1 and frames[-1] >= 64, frames
    with one_thread():
        for x in _features_of(report):
            n = next(d["encoder_frames"] for d in report.decodes if d["feature_frames"] == x.shape[1])
            assert _greedy(report, n) == model.greedy_decode(x, 2 * n)
    assert len(set(_greedy(report, frames[-1]))) >= 2
    assert report.mixed_batch["prefix_lengths"] == [0, 1, 2, 3, 4, 5] and report.row_max_abs_err <= 1e-5


def test_lstm_manager_with_encoder_states(tmp_path):
    """The bundled LSTM attention decoder under the lstm manager: [B, S] states, zeros first, token [B, 1],
    token-length, scores [B, 1, V]; its start context waits for the encoder states, so RASR keeps its parent."""
    model = aed.tiny()

    def step(token, h, c, context, frames, lengths):
        h, c, context = model.step(token, frames, lengths, h[None], c[None], context)
        return model.log_probs(h, context), h[0], c[0], context

    features = TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20], lengths=[1])
    report = export_label_scorer(
        str(tmp_path / "lstm"), kind="state-managed", manager="lstm", score=step, module=model, encoder=model.encode,
        features=features, encoder_dim=32, states=[StateSpec(n, [HYPS, 32]) for n in ("h", "c", "context")],
        vocabulary=VOCAB, sentence_end=0, start_label=0, exporter="torchscript")
    dims, meta = _io(report.files["scorer"])
    assert dims["h_in"] == ["hyps", 32] and dims["token"] == ["hyps", 1] and dims["scores"] == ["hyps", 1, 10]
    assert meta == {"STATE_h_in": "h_out", "STATE_c_in": "c_out", "STATE_context_in": "context_out"}
    assert config.parse(report.config)["decoder.state-manager.type"] == "lstm"
    for x in _features_of(report):
        n = next(d["encoder_frames"] for d in report.decodes if d["feature_frames"] == x.shape[1])
        assert _greedy(report, n) == model.greedy_decode(x, max_labels=2 * n)


def _fake_run(variables):
    """A graph of one [B, 2] state: the state adds the token, the scores read it."""
    def run(tokens, prefix_lengths, merged):
        state = merged[0].reshape(len(tokens), -1)[:, -2:] if merged[0].size else np.zeros((len(tokens), 2), np.float32)
        new = state + np.array(tokens, np.float32)[:, None]
        return np.concatenate([new, -new], 1), [new if len(variables[0].dims) == 2 else new[:, None]]
    return run


def test_rasr_start_context_emulated():
    """RASR master re-runs a context whose state is set; the lstm manager dropped its parent: the emulation
    meets the undefined behaviour as an error. Deferred (encoder states mapped) or with the transformer
    manager (parents kept) the start context scores."""
    lstm_var = [managers.StateVariable("s_in", "s_out", ["hyps", 2])]
    eager = ManagedScorer(managers.Lstm(lstm_var), _fake_run(lstm_var), [3], deferred=False)
    start = eager.root()
    assert start.parent is None and start.state is not None  # scored at once, its parent dropped
    with pytest.raises(LabelScorerError) as err:
        eager.score([start])
    assert "402-404" in str(err.value) and err.value.rule == "no undefined behaviour in RASR"
    deferred = ManagedScorer(managers.Lstm(lstm_var), _fake_run(lstm_var), [3], deferred=True)
    assert deferred.score([deferred.root()])[0].tolist() == [3, 3, -3, -3]
    cache_var = [managers.StateVariable("s_in", "s_out", ["hyps", "prefix", 2])]
    kept = ManagedScorer(managers.Transformer(cache_var), _fake_run(cache_var), [3], deferred=False)
    start = kept.root()
    assert kept.score([start])[0].tolist() == [3, 3, -3, -3] and kept.runs == 2  # run again, as RASR does
    with pytest.raises(LabelScorerError):
        ManagedScorer(managers.Transformer(cache_var), _fake_run(cache_var), [], deferred=False).score([Ctx(())])
    two = ManagedScorer(managers.Transformer(cache_var), _fake_run(cache_var), [3, 4], deferred=True)
    with pytest.raises(LabelScorerError) as err:  # two start labels deferred: the first never scored
        two.score([two.root()])
    assert "null state" in str(err.value)


def test_transformer_manager_left_pads_and_cuts_to_max_history():
    var = [managers.StateVariable("k_in", "k_out", ["hyps", "prefix", 2])]
    one = [np.full((1, 1, 2), v, np.float32) for v in (1.0, 2.0, 3.0)]
    chains = [[], [[one[0]], [one[1]]], [[one[0]], [one[1]], [one[2]]]]
    merged, fed = managers.Transformer(var).merge([0, 2, 3], chains)
    assert fed == [0, 2, 3] and merged[0].shape == (3, 3, 2)
    assert merged[0][:, :, 0].tolist() == [[0, 0, 0], [0, 1, 2], [1, 2, 3]]  # right-aligned, zeros before
    cut, fed = managers.Transformer(var, max_history=1).merge([0, 2, 3], chains)
    assert fed == [0, 1, 1] and cut[0][:, :, 0].tolist() == [[0], [2], [3]]
    rows = managers.Transformer(var).split([np.arange(12, dtype=np.float32).reshape(2, 3, 2)], 2)
    assert rows[1][0].tolist() == [[[10, 11]]]  # the last position: prefix and suffix out, RASR reads the suffix


def test_loader_findings(transformer_lm):
    """RASR's loading of the written folder, broken one way at a time."""
    _, report = transformer_lm
    proto = onnx.load(report.files["scorer"])
    values = config.parse(report.config)
    io_map = config.graph_settings(values, "onnx-model")["io-map"]
    settings = managers.decoder_settings(values, "")
    assert managers.findings({"scorer": proto}, {"scorer": io_map}, settings, 10) == []

    def rules(graphs=None, maps=None, **changed):
        found = managers.findings(graphs or {"scorer": proto}, {"scorer": maps or io_map}, {**settings, **changed}, 10)
        return {f.rule for f in found}

    assert "start-labels set" in rules(**{"start-labels": ""})
    assert {"lstm manager state dims", "lstm manager needs an encoder input"} <= rules(**{"state-manager.type": "lstm"})
    assert "mapped name exists" in rules(maps={**io_map, "token-length": "tokens:size1"})  # i6's own spelling
    assert "every input fed" in rules(maps={k: v for k, v in io_map.items() if k != "prefix-length"})
    assert "scores as wide as the vocabulary" in {f.rule for f in managers.findings(
        {"scorer": proto}, {"scorer": io_map}, settings, 11)}
    stateless = onnx.ModelProto()
    stateless.CopyFrom(proto)
    del stateless.metadata_props[:]
    assert {"at least one state", "every input fed"} <= rules(graphs={"scorer": stateless})


@needs_dynamo
def test_transformer_lm_and_lstm_lm_with_dynamo(tmp_path):
    for name, model in (("transformer", transformer_decoder.tiny_lm()), ("lstm", lstm_lm.tiny())):
        report = export_label_scorer(str(tmp_path / name), exporter="dynamo", **_lm_job(model))
        assert report.graphs["scorer"]["exporter"] == "dynamo"
        assert _greedy(report) == model.greedy_decode(20), name
        assert report.mixed_batch["prefix_lengths"][0] == 0 and report.row_max_abs_err <= 1e-5


def _full_context_job(model, **overrides):
    job = dict(kind="full-context", release="full-context-pr", score=model.full_context, module=model,
               vocabulary=VOCAB, sentence_end=0, start_label=0)
    job.update(overrides)
    return job


def test_full_context_lm_opt_in_and_decodes_as_the_kv_cache(transformer_lm, tmp_path):
    """full-context-onnx (RASR's open PR #241) only with release='full-context-pr'; the same Transformer LM
    fed its whole right-padded history decodes as its KV-cache graph does; a callable reading the padding is
    refused before any export."""
    model, kv = transformer_lm
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(tmp_path / "master"), **_full_context_job(model, release="master"))
    assert err.value.rule == "type in release" and not (tmp_path / "master").exists()
    report = export_label_scorer(str(tmp_path / "full"), exporter="torchscript", **_full_context_job(model))
    values = config.parse(report.config)
    assert values["type"] == "full-context-onnx" and values["start-label-index"] == "0"
    assert values["onnx-model.io-map.history-size"] == "history:size1"  # the PR's name, not i6's history-length
    dims, _ = _io(report.files["scorer"])
    assert dims["history"] == ["hyps", "history"] and dims["history:size1"] == ["hyps"]
    assert [d["labels"] for d in report.decodes] == [d["labels"] for d in kv.decodes]
    assert all(abs(a["cost_onnx"] - b["cost_onnx"]) < 1e-4 for a, b in zip(report.decodes, kv.decodes))
    assert report.mixed_batch["history_lengths"] == [1, 2, 3, 4, 5, 6]
    assert report.rows_checked >= 6 and report.row_max_abs_err <= 1e-5
    reads_padding = _full_context_job(model, score=lambda h, n: model.full_context(h, torch.full_like(n, h.shape[1])))
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(tmp_path / "padding"), exporter="torchscript", **reads_padding)
    assert err.value.rule == "padding ignored" and not (tmp_path / "padding").exists()


@needs_dynamo
def test_transformer_aed_decoder_with_dynamo(tmp_path):
    """The decoder graph under dynamo; the Conformer encoder stays on TorchScript (its dynamo export is tested
    elsewhere and costs most of a minute)."""
    model = transformer_decoder.tiny_aed()
    report = export_label_scorer(str(tmp_path / "aed"), exporter={"encoder": "torchscript", "scorer": "dynamo"},
                                 **transformer_decoder.label_scorer_job("aed"))
    assert {g: r["exporter"] for g, r in report.graphs.items()} == {"encoder": "torchscript", "scorer": "dynamo"}
    with one_thread():
        for x in _features_of(report):
            n = next(d["encoder_frames"] for d in report.decodes if d["feature_frames"] == x.shape[1])
            assert _greedy(report, n) == model.greedy_decode(x, 2 * n)
    assert os.path.exists(report.files["report"])


def _neg_log_probs(step_out, targets):
    """``-log p`` of each next label from a step's log-probs ``[1, S, V]`` (no cache, the whole sequence)."""
    log_probs = step_out[0][0]
    return -float(sum(log_probs[i, t] for i, t in enumerate(targets)))


def test_combination_aed_ctc_prefix_and_lm(tmp_path):
    """AED + CTC prefix + LM in one label-synchronous search, each scaled: through the written graphs as RASR
    calls them and through PyTorch, the same labels and costs; and each decode's cost is the scaled sum the
    models give on their own: the AED's and the LM's -log p of the labels and the sentence end, and PyTorch's
    CTC loss of the labels (the CTC prefix costs of a finished hypothesis add up to it)."""
    from onnx_compat.label_scorers.combine import combine_label_scorers
    jobs = [transformer_decoder.label_scorer_job(k) for k in ("aed", "ctc", "lm")]
    for job in jobs:
        job["exporter"] = "torchscript"
    report = combine_label_scorers(str(tmp_path / "combined"), [(jobs[0], 1.0), (jobs[1], 0.5), (jobs[2], 0.3)])
    values = config.parse(open(os.path.join(report.folder, "label-scorer.config")).read())
    assert values["type"] == "combine" and values["num-scorers"] == "3"
    assert values["scorer-2.type"] == "ctc-prefix" and values["scorer-2.blank-label-index"] == "10"
    assert values["scorer-2.ctc-scorer.decoder.type"] == "no-context-onnx"
    assert values["scorer-3.type"] == "state-managed-onnx" and values["scorer-3.scale"] == "0.3"
    assert os.path.exists(values["scorer-1.decoder.onnx-model.session.file"])
    assert {d["search"] for d in report.decodes} == {"greedy, label-synchronous", "beam 4, label-synchronous"}
    model, lm = transformer_decoder.tiny_aed(), transformer_decoder.tiny_lm()
    gen = np.random.default_rng(0)
    checked = 0
    for n in sorted({d["feature_frames"] for d in report.decodes}):
        x = torch.from_numpy(gen.standard_normal((1, n, 20)).astype(np.float32))
        for d in (d for d in report.decodes if d["feature_frames"] == n):
            if len(d["labels"]) >= 2 * d["encoder_frames"]:
                continue  # stopped at the label limit: no sentence end scored
            labels = d["labels"]
            tokens, targets = torch.tensor([[0] + labels]), labels + [0]
            with torch.no_grad(), one_thread():
                enc, lengths = model.encode(x, torch.tensor([n], dtype=torch.int32))
                args = (tokens, torch.tensor([len(targets)]), torch.tensor([0]))
                aed_cost = _neg_log_probs(model.decoder.step(*args, *model.decoder.empty_caches(), enc,
                                                             lengths.long()), targets)
                lm_cost = _neg_log_probs(lm.step(*args, *lm.empty_caches()), targets)
                ctc = torch.nn.functional.ctc_loss(model.ctc_log_probs(enc)[0][:, None], torch.tensor([labels]),
                                                   torch.tensor([enc.shape[1]]), torch.tensor([len(labels)]),
                                                   blank=10, reduction="sum")
            assert abs(d["cost_pytorch"] - (aed_cost + 0.5 * float(ctc) + 0.3 * lm_cost)) < 1e-3, d
            assert abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-3
            checked += 1
    assert checked >= 3, report.decodes
    with pytest.raises(LabelScorerError) as err:
        combine_label_scorers(str(tmp_path / "two"), [(jobs[0], 1.0), (jobs[0], 1.0)])
    assert err.value.rule == "one AED" and not (tmp_path / "two").exists()


def test_folder_train_mode_and_arguments_refused_before_any_work(tmp_path):
    """A module in train mode, a foreign graph in the folder, a manager for another kind, an argument of
    another kind: each refused by name with nothing written; an earlier export's file not written again is
    removed once the new export is written."""
    model = transformer_decoder.tiny_lm()
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(tmp_path / "train"), **_lm_job(transformer_decoder.tiny_lm().train()))
    assert err.value.rule == "module in eval mode" and not (tmp_path / "train").exists()
    for bad, rule in (({"kind": "stateful"}, "manager for state-managed"),
                      ({"initial": model.step}, "arguments of the kind"),
                      ({"manager": "kv"}, "known state manager"),
                      ({"start_label": 10}, "start_labels ids")):
        with pytest.raises(LabelScorerError) as err:
            export_label_scorer(str(tmp_path / "bad"), **_lm_job(model, **bad))
        assert err.value.rule == rule, (bad, err.value.rule)
    from onnx_compat.label_scorers.state_managed import export_state_managed
    aed_job = transformer_decoder.label_scorer_job("aed")
    for key in ("kind", "start_label"):
        aed_job.pop(key)
    with pytest.raises(LabelScorerError) as err:  # RASR would score a start context whose parent has no state
        export_state_managed(str(tmp_path / "bad"), start_labels=[0, 1], **aed_job)
    assert err.value.rule == "no undefined behaviour in RASR" and err.value.tensor == "start_labels"
    ignores = _lm_job(model, score=lambda t, tl, pl, *c: model.step(t, torch.full_like(tl, t.shape[1]), pl, *c),
                      module=model)
    with pytest.raises(LabelScorerError) as err:  # a step that never masks the suffix: its lengths unused
        export_label_scorer(str(tmp_path / "bad"), **ignores)
    assert err.value.rule == "every input is used" and err.value.tensor == "token:size1"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "state-updater.onnx").write_bytes(b"mine")
    with pytest.raises(LabelScorerError) as err:
        export_label_scorer(str(foreign), exporter="torchscript", **_lm_job(model))
    assert err.value.rule == "folder holds no stale graphs" and sorted(os.listdir(foreign)) == ["state-updater.onnx"]
    again = tmp_path / "again"
    again.mkdir()
    (again / "encoder.onnx").write_bytes(b"an earlier AED's encoder")
    (again / "report.json").write_text(json.dumps({"files": {"encoder": str(again / "encoder.onnx")}}))
    report = export_label_scorer(str(again), exporter="torchscript", **_lm_job(model))
    assert report.removed == [str(again / "encoder.onnx")] and not (again / "encoder.onnx").exists()
    assert sorted(os.listdir(again)) == ["label-scorer.config", "report.json", "scorer.onnx"]


def test_combination_refuses_mixed_searches_and_bad_scales(tmp_path):
    """Refused before any export: a transducer beside an AED (two searches), a transducer not first, a
    scorer with an encoder beside a transducer, an LM over another vocabulary than the transducer's, a kind
    no search combines, a scale that is not a positive number, an existing folder."""
    from onnx_compat.label_scorers.combine import combine_label_scorers
    from onnx_compat.models import label_scorer_jobs
    aed_job, lm_job = transformer_decoder.label_scorer_job("aed"), transformer_decoder.label_scorer_job("lm")
    transducer_job, transducer_lm = label_scorer_jobs.transducer(), label_scorer_jobs.transducer_lm()
    (tmp_path / "exists").mkdir()
    for scorers, rule, folder in (([(aed_job, 1.0), (transducer_job, 0.5)], "one transducer first", "refused"),
                                  ([(transducer_lm, 1.0), (transducer_job, 0.5)], "one transducer first", "refused"),
                                  ([(transducer_job, 1.0), (aed_job, 0.5)], "LMs beside a transducer", "refused"),
                                  ([(transducer_job, 1.0), (lm_job, 0.5)], "one vocabulary", "refused"),
                                  ([(aed_job, 1.0), ({"kind": "bogus"}, 0.5)], "kinds combined", "refused"),
                                  ([(aed_job, 1.0), (lm_job, -0.3)], "scale", "refused"),
                                  ([(lm_job, 1.0)], "one AED", "refused"),
                                  ([(transducer_job, 1.0), (transducer_lm, 0.1)], "new folder", "exists")):
        with pytest.raises(LabelScorerError) as err:
            combine_label_scorers(str(tmp_path / folder), scorers)
        assert err.value.rule == rule, (rule, err.value.rule)
        assert not (tmp_path / "refused").exists() and os.listdir(tmp_path / "exists") == []


def test_transducer_and_lm_in_the_time_synchronous_search(tmp_path):
    """Issue 46 (Deliver 4, transducer + LM): RASR's combine cannot hold a transducer with an LM (no blank
    transition both presets enable), so the fragment is the search's num-label-scorers with one
    [*.label-scorer-<i>] per scorer. The combined time-synchronous search through the written graphs decodes
    as in PyTorch (greedy and beam, labels staying on or consuming the frame), and its greedy decode with
    labels consuming the frame is what the two models give written out by hand: each frame the cheapest of
    blank (the transducer's cost alone) and each label (the transducer's cost plus 0.1 x the LM's -log p of
    it after the labels so far), the LM's context unchanged by blank."""
    from onnx_compat.label_scorers import combine_label_scorers
    from onnx_compat.label_scorers.combine_timesync import sections
    from onnx_compat.models import label_scorer_jobs
    transducer_job, lm_job = label_scorer_jobs.transducer(), label_scorer_jobs.transducer_lm()
    for job in (transducer_job, lm_job):
        job.update(exporter="torchscript", beam=2)
    transducer_job["utterances"] = [1, 120]  # a frame, and long enough for labels to beat blank with the LM
    report = combine_label_scorers(str(tmp_path / "ts"), [(transducer_job, 1.0), (lm_job, 0.1)], beam=2)
    parts = sections(open(os.path.join(report.folder, "label-scorer.config")).read())
    assert parts["[*]"] == {"num-label-scorers": "2"}
    assert parts["[*.label-scorer-1]"]["decoder.type"] == "stateful-transducer-onnx"
    assert parts["[*.label-scorer-2]"]["type"] == "state-managed-onnx" and parts["[*.label-scorer-2]"]["scale"] == "0.1"
    assert "type = combine" not in report.config and "blank-label-index = 11" in report.config
    assert [s["role"] for s in report.scorers] == ["transducer", "lm"]
    assert len({d["search"] for d in report.decodes}) == 4 and any(d["labels"] for d in report.decodes)
    model, lm, blank = transducer_job["module"], lm_job["module"], transducer_job["blank"]
    gen = np.random.default_rng(0)
    checked = 0
    for n in sorted({d["feature_frames"] for d in report.decodes}):
        x = torch.from_numpy(gen.standard_normal((1, n, 20)).astype(np.float32))
        labels, cost = [], 0.0
        with torch.no_grad(), one_thread():
            enc, _ = model.encode(x, torch.tensor([n], dtype=torch.int32))
            h, c, out = model.initial_states()
            for t in range(enc.shape[1]):
                total = -model.score(enc[:, t], out)[0].double()
                history = torch.tensor([[0] + labels])
                lm_cost = -lm.step(history, torch.tensor([history.shape[1]]), torch.tensor([0]),
                                   *lm.empty_caches())[0][0, -1].double()
                total = torch.where(torch.arange(total.shape[0]) == blank, total, total + 0.1 * lm_cost)
                v = int(total.argmin())
                cost += float(total[v])
                if v != blank:
                    labels.append(v)
                    h, c, out = model.predict(torch.tensor([v]), h, c)
        d = next(d for d in report.decodes if d["feature_frames"] == n and d["search"] ==
                 "greedy, time-synchronous, labels consume the frame")
        assert d["labels"] == labels and abs(d["cost_pytorch"] - cost) < 1e-3 * (1 + n), (d, labels, cost)
        assert abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-3 * (1 + n)
        checked += bool(labels)
    assert checked >= 1, report.decodes
