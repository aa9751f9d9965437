"""int8 and float16 versions of the bundled models: made by ONNX Runtime's tools, verified with measures that
fit an approximate model, loaded from their paths; automatic exclusion; one clear error per bad input."""
import argparse
import hashlib
import json
import logging
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_compat
from onnx_compat.models import blstm, conformer
from onnx_compat.quantization import QuantizationError, finish_export, float_path_for, quantize
from onnx_compat.quantization import cli as quantize_cli
from onnx_compat.quantization.measures import CtcAgreement, Snr, Top1Agreement, greedy_ctc, resolve
from onnx_compat.spec import make_inputs
from onnx_compat.testing import assert_not_degenerate

logging.getLogger("onnxruntime").setLevel(logging.ERROR)  # the quantizers' advice on pre-processing
logging.getLogger().setLevel(logging.ERROR)

MODELS = {"conformer": conformer.tiny, "blstm": lambda: blstm.build(hidden=32)}
RECIPES = ["int8-dynamic", "int8-dynamic-conv", "int8-dynamic-per-channel", "int8-static", "fp16"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each bundled model exported (TorchScript) and verified once: {name: (job, path, report)}."""
    folder = tmp_path_factory.mktemp("float")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, factory in MODELS.items():
            job = factory()
            path = str(folder / f"{name}.onnx")
            report = onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript")
            report.to_json(str(folder / f"{name}.json"))
            out[name] = (job, path, report)
    return out


def _digest(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _eager_agreement(path, job, sizes):
    """Independent of the package: the written model from its path against the unpatched eager model."""
    feeds = make_inputs(job["inputs"], sizes, seed=77)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got, got_len = sess.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        ref, ref_len = (t.numpy() for t in job["model"](*feeds.values()))
    assert np.array_equal(got_len, ref_len), f"lengths differ at {sizes}: {got_len} vs {ref_len}"
    assert got.shape == ref.shape, f"shape at {sizes}: ONNX {got.shape}, eager {ref.shape}"
    assert_not_degenerate(ref, f"at {sizes}")
    valid = np.arange(ref.shape[1])[None, :] < ref_len[:, None]
    return float((got.argmax(-1) == ref.argmax(-1))[valid].mean()), float(np.abs(got - ref)[valid].max())


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", list(MODELS))
def test_recipe_is_verified_and_loads_from_its_path(exported, name, recipe, tmp_path):
    job, path, report = exported[name]
    before = _digest(path)
    out = str(tmp_path / f"{name}.{recipe}.onnx")
    q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe=recipe, out=out, report=report,
                 measures=["snr", "cosine", "top1"])
    assert _digest(path) == before, "the float model was changed"
    assert q.path == out and os.path.isfile(out) and q.verification["ok"]
    checks = q.verification["checks"]
    assert {c["against"] for c in checks} == {"float", "eager"} and all(c["ok"] for c in checks)
    assert {1} <= {s["batch"] for s in q.verification["sizes"]}, "B=1 must be among the checked shapes"
    assert (q.calibration is not None) == recipe.startswith("int8-static")
    for sizes in ({"batch": 1, "time": 29}, {"batch": 3, "time": 61}):
        agree, err = _eager_agreement(out, job, sizes)
        assert agree >= 0.9, f"{name} {recipe}: top-1 agreement {agree:.3f} with eager at {sizes}"
        assert err > 0, f"{name} {recipe}: identical to eager at {sizes}: nothing was quantized"


@pytest.mark.parametrize("name, recipe, smaller", [("conformer", "int8-dynamic-conv", 0.7), ("conformer", "fp16", 0.7),
                                                  ("blstm", "fp16", 0.6)])
def test_recipes_make_smaller_files(exported, name, recipe, smaller, tmp_path):
    job, path, report = exported[name]
    q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe=recipe, out=str(tmp_path / "q.onnx"),
                 report=report)
    assert q.bytes["quantized"] == os.path.getsize(q.path) and q.bytes["ratio"] < smaller, q.bytes


def test_fp16_keeps_float32_io_unless_asked(exported, tmp_path):
    job, path, report = exported["conformer"]
    types = {}
    for recipe in ("fp16", "fp16-io"):
        q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe=recipe, report=report,
                     out=str(tmp_path / f"{recipe}.onnx"))
        graph = onnx.load(q.path).graph
        types[recipe] = [v.type.tensor_type.elem_type for v in (graph.input[0], graph.output[0])]
    assert types["fp16"] == [onnx.TensorProto.FLOAT] * 2 and types["fp16-io"] == [onnx.TensorProto.FLOAT16] * 2


def test_exclusion_turns_a_missed_threshold_into_a_met_one(exported, tmp_path):
    """int8-static on the Conformer, asked for 1 dB more SNR than the recipe gives: without exclusion the
    threshold is missed (and nothing written); with it, the worst nodes stay float and it is met. With 7-bit
    weights the error is spread over the graph's 30 weighted nodes (16 out gave 0.3 dB, 18 out 1.5 dB, on an
    AVX2 machine), so exclusion may take all of them."""
    job, path, report = exported["conformer"]
    out = str(tmp_path / "static.onnx")
    with pytest.raises(QuantizationError) as missed:
        quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-static", out=out, report=report,
                 thresholds={"snr": 60.0}, exclude_limit=0)
    err = missed.value
    assert err.measure == "snr" and err.output == "output" and err.recipe == "int8-static" and err.got < 60.0
    assert "short by" in str(err) and not os.path.exists(out)
    wanted = err.got + 1.0
    with pytest.raises(QuantizationError, match="none helps|did not help"):
        quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-static", out=out, report=report,
                 thresholds={"snr": wanted}, exclude_limit=0)
    q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-static", out=out, report=report,
                 thresholds={"snr": wanted}, exclude_limit=30)
    snr = [c["got"] for c in q.verification["checks"] if c["measure"] == "snr"]
    assert q.excluded and min(snr) >= wanted, (q.excluded, snr, wanted)
    cost = q.exclusion_cost
    assert cost["bytes_added"] > 0 and cost["missed_before"] and os.path.getsize(out) == q.bytes["quantized"]
    excluded = {n for c in q.excluded for n in c["nodes"]}
    kept_float = {n.name for n in onnx.load(out).graph.node if n.name in excluded}
    assert kept_float == excluded, "excluded nodes must stay float nodes of the same name"


def _nothing_written(tmp_path, path, before):
    assert list(tmp_path.iterdir()) == [] and _digest(path) == before


@pytest.mark.parametrize("case, match, fields", [
    ("no_report", "needs the float model's verification report", {}),
    ("other_report", "describes another model", {}),
    ("unverified", "holds no verification", {}),
    ("unknown_recipe", "unknown recipe 'int4'", {"recipe": "int4"}),
    ("example_name", "unknown input", {"recipe": "int8-static"}),
    ("example_shape", "dim 2 is 21, declared static 20", {"recipe": "int8-static"}),
    ("impossible_cosine", "cannot be met", {"measure": "cosine", "threshold": 1.5, "output": "output"}),
    ("beyond_float", "the float model itself scores", {"measure": "snr", "threshold": 1000.0, "output": "output"}),
    ("unknown_measure", "unknown measure 'wer'", {"measure": "wer"}),
    ("out_is_float", "is the float model itself", {}),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(exported, tmp_path, case, match, fields):
    job, path, report = exported["conformer"]
    kwargs = dict(recipe="int8-static", report=report, out=str(tmp_path / "q.onnx"))
    good = make_inputs(job["inputs"], {"batch": 2, "time": 40}, seed=3)
    kwargs.update({
        "no_report": dict(report=None),
        "other_report": dict(report=exported["blstm"][2]),
        "unverified": dict(report={**report.to_dict(), "verification": []}),
        "unknown_recipe": dict(recipe="int4"),
        "example_name": dict(examples=[{"features": good["data"], "data:size1": good["data:size1"]}]),
        "example_shape": dict(examples=[{"data": torch.randn(2, 40, 21), "data:size1": good["data:size1"]}]),
        "impossible_cosine": dict(thresholds={"cosine": 1.5}),
        "beyond_float": dict(thresholds={"snr": 1000.0}),
        "unknown_measure": dict(measures=["snr", "wer"]),
        "out_is_float": dict(out=path),
    }[case])
    before = _digest(path)
    with pytest.raises(QuantizationError, match=match) as raised:
        quantize(path, job["model"], job["inputs"], job["outputs"], **kwargs)
    assert isinstance(raised.value, ValueError)
    for key, value in fields.items():
        assert getattr(raised.value, key) == value, (key, getattr(raised.value, key))
    _nothing_written(tmp_path, path, before)


def test_report_json_path_is_accepted_and_user_examples_calibrate(exported, tmp_path):
    job, path, _ = exported["blstm"]
    examples = [make_inputs(job["inputs"], {"batch": 2, "time": 50}, seed=40 + k) for k in range(3)]
    q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-static", out=str(tmp_path / "s.onnx"),
                 report=path[:-5] + ".json", examples=examples, measures={"output": ["snr", "ctc"]})
    assert q.calibration == "3 user example(s)" and q.float_report.endswith(".json")
    assert {c["measure"] for c in q.verification["checks"]} == {"snr", "ctc"}


def test_finish_export_writes_quantized_at_path_and_float_beside(exported, tmp_path):
    job, path, report = exported["conformer"]
    proto, target = onnx.load(path), str(tmp_path / "model.onnx")
    q = finish_export(proto, target, job["model"], job["inputs"], job["outputs"], report, recipe="int8-dynamic")
    assert q.path == target and q.float_path == float_path_for(target) == str(tmp_path / "model.float.onnx")
    assert onnx.load(q.float_path).SerializeToString() == proto.SerializeToString()
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(target).graph.node)
    failed = str(tmp_path / "failed" / "m.onnx")
    os.mkdir(os.path.dirname(failed))
    with pytest.raises(QuantizationError, match="short by"):
        finish_export(proto, failed, job["model"], job["inputs"], job["outputs"], report, recipe="int8-static",
                      thresholds={"snr": 59.0}, exclude_limit=1)
    assert os.listdir(os.path.dirname(failed)) == [], "a failed quantization writes neither model"


def test_cli_quantize(exported, tmp_path, capsys):
    _, path, _ = exported["conformer"]
    parser = argparse.ArgumentParser()
    quantize_cli.add_parser(parser.add_subparsers(dest="command"))
    out, as_json = tmp_path / "c.onnx", tmp_path / "q.json"
    args = parser.parse_args(["quantize", path, "onnx_compat.models.conformer:tiny", "--recipe", "int8-dynamic",
                              "--report", path[:-5] + ".json", "--out", str(out), "--measure", "output=top1",
                              "--threshold", "top1=0.97", "--json", str(as_json)])
    assert quantize_cli.run(args) == 0 and out.is_file()
    data = json.loads(as_json.read_text())
    assert data["measures"] == {"output": ["top1 >= 0.97"]} and data["verification"]["ok"]
    assert "recipe      int8-dynamic" in capsys.readouterr().out


def test_measures_mask_padding_and_decode_ctc():
    ref = np.log(np.full((2, 4, 3), 0.1, dtype=np.float32))
    ref[..., 1] = np.log(0.8)
    lengths = np.array([4, 2])
    mask = np.arange(4)[None, :, None] < lengths[:, None, None]
    mask = np.broadcast_to(mask, ref.shape)
    got = ref.copy()
    got[1, 2:, 2] = 5.0  # differs only beyond the second sequence's length
    assert Snr().score(got, ref, mask) == np.inf and Top1Agreement().score(got, ref, mask) == 1.0
    got[0, 0, 2] = 5.0  # one valid frame now has another best class
    assert Top1Agreement().score(got, ref, mask) == pytest.approx(5 / 6) and Snr().score(got, ref, mask) < 20
    assert greedy_ctc(np.array([0, 3, 3, 0, 3, 5, 5, 0]), blank=0) == [3, 3, 5]
    assert CtcAgreement().score(got, ref, mask) == pytest.approx(0.5)  # refs [1], [1]; got [2, 1], [1]: 1 edit / 2
    assert CtcAgreement(blank=2).score(got, ref, mask) == 1.0
    picked = resolve(["snr", "ctc:blank=4"], {"output/snr": 30}, ["output"])["output"]
    assert picked[0].threshold == 30 and picked[1].blank == 4


def test_exclusion_that_leaves_the_float_model_is_refused(exported, tmp_path):
    """The BLSTM's int8-dynamic quantizes one MatMul; asked for more SNR than it gives, exclusion takes that
    MatMul out, which leaves the float model: an error, not a renamed copy of the float model."""
    job, path, report = exported["blstm"]
    with pytest.raises(QuantizationError, match="left nothing quantized") as raised:
        quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-dynamic", report=report,
                 out=str(tmp_path / "q.onnx"), thresholds={"snr": 100.0})
    assert raised.value.recipe == "int8-dynamic" and list(tmp_path.iterdir()) == []


def test_export_with_quantize_writes_the_proven_approximation_and_keeps_the_float(tmp_path):
    """export(quantize=...): the float model is proven first, the quantized one is what lands at path,
    the float one beside it; the report says which recipe and where."""
    job = MODELS["blstm"]()
    path = str(tmp_path / "m.onnx")
    report = onnx_compat.export(job["model"], path, job["inputs"], job["outputs"], exporter="torchscript",
                                quantize="fp16")
    assert report.verification and all(c["ok"] for c in report.verification)
    assert report.quantization["recipe"] == "fp16" and report.quantization["float_path"] == float_path_for(path)
    assert os.path.getsize(path) < 0.7 * os.path.getsize(float_path_for(path))
    top1, _ = _eager_agreement(path, job, {"batch": 1, "time": 29})
    assert top1 >= 0.9, top1
    assert "quantized   fp16" in report.summary()


def test_export_refuses_a_bad_quantize_request_before_exporting(tmp_path):
    job = MODELS["blstm"]()
    with pytest.raises(QuantizationError, match="int9"):
        onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"],
                           exporter="torchscript", quantize="int9")
    assert os.listdir(tmp_path) == []


def test_report_of_the_same_architecture_with_other_weights_is_refused(exported, tmp_path):
    """Same graph, other weights: I/O and node count agree, the file's content does not; the report is
    matched to the model file by the content hash export recorded, and nothing is written."""
    job, path, report = exported["blstm"]
    other = blstm.build(hidden=32, seed=1)
    other_path = str(tmp_path / "other" / "b.onnx")
    os.mkdir(os.path.dirname(other_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other_report = onnx_compat.export(other["model"], other_path, other["inputs"], other["outputs"],
                                          exporter="torchscript")
    assert other_report.nodes == report.nodes and other_report.model_sha256 != report.model_sha256
    out = tmp_path / "q.onnx"
    for given in (other_report, other_report.to_dict()):
        with pytest.raises(QuantizationError, match="describes another model"):
            quantize(path, job["model"], job["inputs"], job["outputs"], recipe="fp16", report=given, out=str(out))
        assert not out.exists()
    assert report.model_sha256 == "sha256:" + _digest(path)
    stale = {k: v for k, v in report.to_dict().items() if k != "model_sha256"}
    with pytest.raises(QuantizationError, match="records no content hash"):
        quantize(path, job["model"], job["inputs"], job["outputs"], recipe="fp16", report=stale, out=str(out))
    assert not out.exists()


def test_latency_against_float_and_top1_by_default_on_log_probs(exported, tmp_path):
    """The report holds the medians of interleaved runs against the float model (and says them); a log-prob
    output is measured by its best class too without being asked; most weights left in float32 is warned of."""
    job, path, report = exported["blstm"]
    with pytest.warns(Warning) as caught:
        q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-dynamic", report=report,
                     out=str(tmp_path / "q.onnx"))
    assert {c["measure"] for c in q.verification["checks"]} == {"snr", "cosine", "top1"}
    assert q.measures == {"output": ["snr >= 20", "cosine >= 0.99", "top1 >= 0.95"]}
    lat = q.latency
    assert lat["rounds"] >= 5 and lat["float_s"] > 0 and lat["quantized_s"] > 0
    assert lat["ratio"] == pytest.approx(lat["quantized_s"] / lat["float_s"], rel=1e-3)
    assert "latency     " in q.summary() and "interleaved" in q.summary()
    # the BLSTM's LSTM weights are most of the model and int8-dynamic quantizes MatMul only
    assert q.float_weights > 0.5 and any("stay float32" in w for w in q.warnings), q.warnings
    assert any("stay float32" in str(w.message) for w in caught)


def test_a_slower_quantized_model_is_warned_of(exported, tmp_path, monkeypatch):
    """Timings supplied through the one seam that reads the clock: quantized 1.3x the float time."""
    from onnx_compat.quantization import QuantizationWarning, latency
    monkeypatch.setattr(latency, "run_interleaved",
                        lambda runs, rounds: {"float": [0.010] * rounds, "quantized": [0.013] * rounds})
    job, path, report = exported["conformer"]
    with pytest.warns(QuantizationWarning, match=r"slower than the float model here: 1.30x"):
        q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="fp16", report=report,
                     out=str(tmp_path / "q.onnx"))
    assert q.latency["ratio"] == pytest.approx(1.3) and "slower" in q.summary()
    monkeypatch.setattr(latency, "run_interleaved",
                        lambda runs, rounds: {"float": [0.010] * rounds, "quantized": [0.007] * rounds})
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)
        q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="fp16", report=report,
                     out=str(tmp_path / "q2.onnx"))
    assert q.warnings == [] and q.latency["ratio"] == pytest.approx(0.7)


def test_top1_on_a_classifier_output_by_default(tmp_path):
    """A [B, C] classifier output named logits gets top1 among the default measures."""
    from onnx_compat.quantization.measures import class_outputs
    from onnx_compat import Dim, TensorSpec
    specs = [TensorSpec("logits", [Dim("batch"), 10]), TensorSpec("hidden", [Dim("batch"), Dim("time"), 64])]
    assert class_outputs(specs) == ["logits"]
    picked = resolve(None, None, ["logits", "hidden"], class_outputs=["logits"])
    assert [m.name for m in picked["logits"]] == ["snr", "cosine", "top1"] and len(picked["hidden"]) == 2
    got = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    ref = np.array([[0.2, 0.8], [0.4, 0.6], [0.1, 0.9]])
    assert Top1Agreement().score(got, ref, np.ones_like(ref, dtype=bool)) == pytest.approx(2 / 3)


def test_onnx_runtimes_advice_to_pre_process_is_kept_off_the_terminal(exported, tmp_path, caplog, capfd):
    """quantize_static/quantize_dynamic log 'Please consider to run pre-processing' on every call; we leave
    pre-processing out on purpose, so it is dropped where we call them, and the root logger is left as it was."""
    job, path, report = exported["blstm"]
    caplog.set_level(logging.WARNING)
    handlers = logging.getLogger().handlers[:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize(path, job["model"], job["inputs"], job["outputs"], recipe="int8-static", report=report,
                     out=str(tmp_path / "q.onnx"))
    assert "pre-processing" not in caplog.text and "pre-processing" not in capfd.readouterr().err
    assert logging.getLogger().handlers == handlers and not any("pre-processing" in m for m in q.messages), q.messages


def _timings(per_call):
    """The clock seam: each named run takes ``per_call[name]`` seconds every round (float included)."""
    return lambda runs, rounds: {name: [per_call[name]] * rounds for name in runs}


def test_auto_keeps_the_fastest_recipe_that_meets_the_thresholds(exported, tmp_path, monkeypatch):
    """auto makes and verifies each recipe for CPU ONNX Runtime, times those that met their thresholds in one
    interleaved loop with float, writes the fastest faster than float; every candidate is a row of the report.
    int8-dynamic-all lists ops (Transpose, Gather) the Conformer has but leaves them alone in dynamic mode: it
    makes int8-dynamic-conv's graph, so it is not timed as a candidate of its own."""
    from onnx_compat.quantization import auto, latency
    seen = []
    monkeypatch.setattr(latency, "run_interleaved", lambda runs, rounds: (
        seen.append((sorted(runs), rounds)),
        _timings({"float": 0.010, "int8-dynamic": 0.008, "int8-dynamic-conv": 0.006, "int8-dynamic-all": 0.0065,
                  "int8-static": 0.011, "fp16": 0.012})(runs, rounds))[1])
    job, path, report = exported["conformer"]
    q = quantize(path, job["model"], job["inputs"], job["outputs"], report=report)  # recipe="auto" by default
    timed = [n for n in auto.TARGETS["onnxruntime"] if n != "int8-dynamic-all"]
    assert seen == [(sorted(["float", *timed]), auto.ROUNDS)]  # one loop, all together
    assert q.recipe == "int8-dynamic-conv" and q.path == path[:-5] + ".int8-dynamic-conv.onnx"
    assert q.latency["ratio"] == pytest.approx(0.6) and q.target == "onnxruntime"
    rows = {t["recipe"]: t for t in q.tried}
    assert list(rows) == list(auto.TARGETS["onnxruntime"])
    assert rows["fp16"]["latency"]["ratio"] == pytest.approx(1.2) and rows["fp16"]["ok"]
    assert rows["int8-dynamic-all"]["why"].startswith("not a candidate: made the graph int8-dynamic-conv made")
    for t in q.tried:
        if t["recipe"] in timed:
            assert 0 < t["bytes"]["ratio"] < 1 and t["measures"]["output/top1"] >= 0.95, t
    assert "0.60x" in q.chosen_by and "int8-static" in q.summary() and "1.10x the float time" in q.summary()
    agree, _ = _eager_agreement(q.path, job, {"batch": 3, "time": 41})
    assert agree >= 0.95


def test_auto_never_keeps_a_recipe_slower_than_float(exported, tmp_path, monkeypatch):
    """Every recipe that met its thresholds is slower than float: nothing is written and the error names each
    one's ratio; one that misses a threshold is a row saying so, not the end of auto."""
    from onnx_compat.quantization import latency
    monkeypatch.setattr(latency, "run_interleaved", _timings(
        {"float": 0.010, "int8-dynamic": 0.0105, "int8-dynamic-conv": 0.013, "int8-dynamic-all": 0.012,
         "int8-static": 0.011, "fp16": 0.0101}))
    job, path, report = exported["conformer"]
    out = tmp_path / "q.onnx"
    with pytest.raises(QuantizationError, match=r"no recipe met its thresholds, ran faster than the float model "
                                                r"by more than the timing margin") as err:
        quantize(path, job["model"], job["inputs"], job["outputs"], report=report, target="onnxruntime",
                 out=str(out))
    assert "int8-dynamic: met its thresholds, 1.05x" in str(err.value) and "fp16: met its thresholds, 1.01x" in \
        str(err.value) and err.value.recipe == "auto"
    assert not out.exists() and not os.listdir(tmp_path)
    # a threshold only fp16 meets: the int8 recipes are dropped rows, fp16 (faster here) is kept
    monkeypatch.setattr(latency, "run_interleaved", _timings({"float": 0.010, "fp16": 0.009}))
    q = quantize(path, job["model"], job["inputs"], job["outputs"], report=report, thresholds={"snr": 70},
                 out=str(out), exclude_limit=0)
    assert q.recipe == "fp16" and out.exists()
    dropped = [t for t in q.tried if not t["ok"]]
    assert {t["recipe"] for t in dropped} == {"int8-dynamic", "int8-dynamic-conv", "int8-dynamic-all", "int8-static"}
    assert all("snr" in t["why"] for t in dropped) and "dropped" in q.summary()


def test_naming_only_a_target_is_auto_and_an_unknown_target_is_refused_first(exported, tmp_path, monkeypatch):
    from onnx_compat.quantization import latency
    monkeypatch.setattr(latency, "run_interleaved", _timings(
        {"float": 0.010, "int8-dynamic": 0.007, "int8-dynamic-conv": 0.008, "int8-dynamic-all": 0.0075,
         "int8-static": 0.009, "fp16": 0.02}))
    job = conformer.tiny()
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(job["model"], str(path), job["inputs"], job["outputs"], exporter="torchscript",
                                quantize_options={"target": "onnxruntime==1.16"})
    q = report.steps["quantization"]
    assert q["recipe"] == "int8-dynamic" and q["target"] == "onnxruntime==1.16"
    assert (tmp_path / "m.float.onnx").exists() and any("auto (onnxruntime==1.16)" in line for line in q["summary"])
    for bad in ("openvino", "onnxruntime==0.1"):
        with pytest.raises(QuantizationError, match="target"):
            onnx_compat.export(job["model"], str(tmp_path / "x.onnx"), job["inputs"], job["outputs"],
                               quantize="auto", quantize_options={"target": bad})
    assert not (tmp_path / "x.onnx").exists()
