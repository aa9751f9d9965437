"""hf:DIR -> a proven ONNX model with lengths, no user code: tiny random-init checkpoints of every covered
model type, built here (no downloads), exported through the command-line function, then checked against
transformers' own pipeline (feature extractor -> model with its attention mask) on a padded batch at a
batch size and lengths the export never saw, and loaded from the written folder as a runtime would."""
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # noqa: E402 - before transformers reads it

import numpy as np
import onnxruntime as ort
import pytest
import torch

transformers = pytest.importorskip("transformers")
if not transformers.utils.is_torch_available():
    pytest.skip(f"transformers {transformers.__version__} turns its PyTorch models off with torch {torch.__version__}",
                allow_module_level=True)

from onnx_compat.huggingface import (COVERED, ConfigError, HFError, PreprocessorError, TaskError,  # noqa: E402
                                     UncoveredModelError, WeightsError, from_pretrained_dir)
from onnx_compat.cli import main  # noqa: E402
from onnx_compat.huggingface import files, tiny  # noqa: E402
from onnx_compat.testing import assert_not_degenerate  # noqa: E402

from helpers import HAS_DYNAMO  # noqa: E402

T = transformers
GROUP_NORM = dict(config=dict(feat_extract_norm="group", do_stable_layer_norm=False),
                  extractor=dict(return_attention_mask=False))  # wav2vec2-base style: no mask, zero padding


def test_every_covered_model_type_has_a_tiny_checkpoint():
    assert set(tiny.TINY) == set(COVERED)


# transformers' reference: the class of the task loaded on its own, what it returns, the feature extractor's key
REFERENCE = {
    "ctc": (T.AutoModelForCTC, ["logits"]),
    "audio-classification": (T.AutoModelForAudioClassification, ["logits"]),
    "audio-frame-classification": (T.AutoModelForAudioFrameClassification, ["logits"]),
    "xvector": (T.AutoModelForAudioXVector, ["embeddings", "logits"]),
    "audio-encoder": (T.AutoModel, ["last_hidden_state"]),
    "speech-encoder": (T.AutoModel, ["last_hidden_state"]),
}
LENGTH_FUNCTIONS = ("_get_feat_extract_output_lengths", "_get_subsampling_output_length")  # transformers' names
DYNAMO = "dynamo" if HAS_DYNAMO else "torchscript"
CASES = [  # (model type, task, exporter, checkpoint options)
    pytest.param("wav2vec2", "ctc", "torchscript", {}, id="wav2vec2-ctc"),
    pytest.param("wav2vec2", "ctc", "torchscript", GROUP_NORM, id="wav2vec2-groupnorm-ctc-no-mask"),
    pytest.param("wav2vec2", "xvector", "torchscript", {}, id="wav2vec2-xvector"),
    pytest.param("hubert", "audio-classification", "torchscript", {}, id="hubert-audio-classification"),
    pytest.param("wavlm", "ctc", "torchscript", {}, id="wavlm-ctc"),
    pytest.param("data2vec-audio", "audio-encoder", "torchscript", {}, id="data2vec-audio-encoder"),
    pytest.param("sew", "ctc", "torchscript", {}, id="sew-ctc"),
    pytest.param("sew-d", "ctc", "torchscript", {}, id="sew-d-ctc"),
    pytest.param("unispeech", "ctc", "torchscript", {}, id="unispeech-ctc"),
    pytest.param("unispeech-sat", "audio-frame-classification", "torchscript", {}, id="unispeech-sat-frames"),
    pytest.param("wav2vec2-conformer", "ctc", "torchscript", {}, id="wav2vec2-conformer-ctc"),
    pytest.param("wav2vec2-bert", "ctc", "torchscript", {}, id="wav2vec2-bert-ctc"),
    pytest.param("parakeet_ctc", "ctc", "torchscript", {}, id="parakeet-ctc"),
    pytest.param("lasr_ctc", "ctc", "torchscript", {}, id="lasr-ctc"),
    pytest.param("speech_to_text", "speech-encoder", "torchscript", {}, id="speech_to_text-encoder"),
    pytest.param("whisper", "speech-encoder", DYNAMO, {}, id="whisper-encoder-dynamo"),
    pytest.param("audio-spectrogram-transformer", "audio-classification", "torchscript", {}, id="ast-classification"),
    pytest.param("audio-spectrogram-transformer", "audio-encoder", "torchscript", {}, id="ast-encoder-patches"),
]


def _audio(lengths, seed=3):
    gen = np.random.default_rng(seed)
    return [gen.standard_normal(n).astype(np.float32) * 0.3 for n in lengths]


def _hf_batch(folder, lengths, fixed):
    """transformers' own preprocessing of a padded batch: the feature extractor's tensors (Whisper's padded
    to its 30 s, here 1 s, when the model takes a fixed length)."""
    extractor = T.AutoFeatureExtractor.from_pretrained(folder)
    return extractor(_audio(lengths), sampling_rate=extractor.sampling_rate, return_tensors="pt",
                     padding="max_length" if fixed else True, return_attention_mask=True)


def _onnx_feeds(sess, batch):
    """The extractor's tensors as our I/O: data [B, T(, F)] and data:size1 from its own mask."""
    names = [i.name for i in sess.get_inputs()]
    data = batch["input_values"] if "input_values" in batch else batch["input_features"]
    declared = sess.get_inputs()[0].shape
    if len(declared) == 3 and isinstance(declared[1], int) and declared[1] != data.shape[1]:
        data = data.transpose(1, 2)  # Whisper's [B, F, T] as [B, T, F]
    feeds = {"data": data.numpy()}
    if "data:size1" in names:
        feeds["data:size1"] = batch["attention_mask"].sum(-1).numpy().astype(np.int32)
    return feeds


def _hf_outputs(folder, task, batch, takes_mask):
    cls, attrs = REFERENCE[task]
    model = cls.from_pretrained(folder).eval()
    part = model.get_encoder() if task == "speech-encoder" else model
    args = {k: v for k, v in batch.items() if k != "attention_mask" or takes_mask}
    with torch.no_grad():
        out = part(**args)
        function = next((getattr(part, f) for f in LENGTH_FUNCTIONS if hasattr(part, f)), None)
        lengths = function(batch["attention_mask"].sum(-1)) if function else None
    return [getattr(out, a).numpy() for a in attrs], lengths


def _export(*argv):
    """``onnx-compat export ARGV``'s report (errors raised)."""
    from onnx_compat.cli import _parser
    from onnx_compat.verbs.export import export_from
    return export_from(_parser("export").parse_args(["export", *argv]))


@pytest.mark.parametrize("model_type,task,exporter,options", CASES)
def test_hf_checkpoint_exports_and_matches_transformers_on_a_padded_batch(tmp_path, model_type, task, exporter,
                                                                         options):
    folder = tiny.checkpoint(tmp_path / "ckpt", model_type, task, **options)
    out = tmp_path / "onnx" / "model.onnx"
    out.parent.mkdir()
    report = _export(f"hf:{folder}", "--task", task, "--out", str(out), "--exporter", exporter)

    # the pipeline verified it at shapes the export never saw, B=1 among them
    checked = [v["sizes"] for v in report.verification]
    assert all(v["ok"] for v in report.verification) and {s["batch"] for s in checked} >= {1, 2}, checked
    assert not report.degenerate, report.degenerate
    assert (out.parent / "config.json").is_file() and (out.parent / "preprocessor_config.json").is_file()

    # transformers' pipeline on a padded batch of 4 at lengths unlike the export's: ONNX on valid frames
    lengths = [6331, 3710, 5087, 4502]  # the shortest above every model's minimum (LASR's: 17 frames, 2,720 samples)
    batch = _hf_batch(folder, lengths, json.loads(report.metadata["hf.fixed"]).get("time"))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    takes_mask = report.metadata["hf.attention_mask"] == "true"
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, _onnx_feeds(sess, batch))))
    expected, frames = _hf_outputs(folder, task, batch, takes_mask)
    names = [o["name"] for o in report.outputs if not o["name"].endswith(":size1")]
    for onnx_name, want in zip(names, expected):
        have = got[onnx_name]
        assert have.shape == want.shape, f"{onnx_name}: ONNX {have.shape}, transformers {want.shape} (B=4)"
        valid = np.ones(want.shape, dtype=bool)
        if onnx_name == "output" and "output:size1" in got:
            np.testing.assert_array_equal(got["output:size1"], frames.numpy(), err_msg="output lengths at B=4")
            valid = np.broadcast_to(np.arange(want.shape[1])[None, :, None] < got["output:size1"][:, None, None],
                                    want.shape)
            assert got["output:size1"].min() < want.shape[1], "the batch must have padded frames"
        scale = np.abs(want[valid]).max()
        assert_not_degenerate(want[valid], f"{onnx_name}: transformers output")
        err = np.abs(have[valid] - want[valid]).max()
        assert err <= 1e-4 * max(1.0, scale), f"{onnx_name}: max abs err {err:.3g} at B=4, samples {lengths}"


def test_fixed_sizes_come_from_the_model_and_agree_with_the_extractor(tmp_path):
    whisper = from_pretrained_dir(tiny.checkpoint(tmp_path / "w", "whisper", "speech-encoder"), "speech-encoder")
    assert whisper.fixed == {"time": 100, "features": 20}  # 2 x max_source_positions, num_mel_bins
    assert [s.name for s in whisper.inputs] == ["data", "data:size1"] and whisper.inputs[0].dims[1:] == (100, 20)
    folder = tiny.checkpoint(tmp_path / "a", "audio-spectrogram-transformer", "audio-classification")
    ast = from_pretrained_dir(folder, "audio-classification")
    assert ast.fixed == {"time": 64, "features": 32} and [s.name for s in ast.inputs] == ["data"]
    T.WhisperFeatureExtractor(feature_size=20, chunk_length=2).save_pretrained(tmp_path / "w")
    with pytest.raises(PreprocessorError, match="nb_max_frames=200 frames, but the model takes exactly 100"):
        from_pretrained_dir(tmp_path / "w", "speech-encoder")


def test_the_task_follows_the_checkpoints_architecture(tmp_path):
    job = from_pretrained_dir(tiny.checkpoint(tmp_path / "c", "wavlm", "ctc"))
    assert job.task == "ctc" and [s.name for s in job.outputs] == ["output"]
    assert [s.onnx_names for s in job.inputs] == [["data", "data:size1"]]
    assert job.outputs[0].onnx_names == ["output", "output:size1"]


def test_the_written_folder_loads_as_a_runtime_loads_it(tmp_path):
    """onnxruntime and transformers' Auto classes on the written folder alone (the checkpoint removed)."""
    import shutil
    folder = tiny.checkpoint(tmp_path / "ckpt", "wav2vec2", "ctc", tokenizer=True)
    out = tmp_path / "deploy" / "model.onnx"
    out.parent.mkdir()
    assert main(["export", f"hf:{folder}", "--out", str(out), "--exporter", "torchscript"]) == 0  # task from the config
    audio = _audio([4000, 2500])
    expected = _transformers_transcripts(folder, audio)
    shutil.rmtree(folder)
    deploy = str(out.parent)
    assert {"config.json", "model.onnx", "preprocessor_config.json", "tokenizer_config.json", "vocab.json"} <= \
        set(os.listdir(deploy)) and not any(n.endswith(".safetensors") for n in os.listdir(deploy))
    config = T.AutoConfig.from_pretrained(deploy)
    extractor = T.AutoFeatureExtractor.from_pretrained(deploy)
    tokenizer = T.AutoTokenizer.from_pretrained(deploy)
    assert config.model_type == "wav2vec2" and config.vocab_size == len(tokenizer)
    batch = extractor(audio, sampling_rate=extractor.sampling_rate, padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["hf.task"] == "ctc" and meta["hf.model_type"] == "wav2vec2"
    logits, frames = sess.run(["output", "output:size1"], {
        "data": batch["input_values"], "data:size1": batch["attention_mask"].sum(-1).astype(np.int32)})
    assert logits.shape[2] == config.vocab_size and frames.tolist()[0] == logits.shape[1] > frames.tolist()[1]
    texts = tokenizer.batch_decode([row[:n].argmax(-1) for row, n in zip(logits, frames)])
    assert texts == expected and any(texts), (texts, expected)


def _transformers_transcripts(folder, audio):
    """Greedy CTC transcripts by transformers alone: its processor, model and tokenizer on the checkpoint."""
    extractor, tokenizer = T.AutoFeatureExtractor.from_pretrained(folder), T.AutoTokenizer.from_pretrained(folder)
    batch = extractor(audio, sampling_rate=extractor.sampling_rate, padding=True, return_tensors="pt")
    model = T.AutoModelForCTC.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(**batch).logits
        frames = model._get_feat_extract_output_lengths(batch["attention_mask"].sum(-1))
    return tokenizer.batch_decode([row[:n].argmax(-1) for row, n in zip(logits, frames)])


# bad input: one error each, before anything is written
def _nothing_written(folder):
    return not os.path.exists(folder) or os.listdir(folder) == []


def test_a_folder_without_config_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match="has no config.json") as info:
        from_pretrained_dir(tmp_path / "empty", "ctc")
    assert info.value.folder == str(tmp_path / "empty") and info.value.model_type is None
    assert main(["export", f"hf:{tmp_path / 'empty'}", "--task", "ctc", "--out", str(out / "m.onnx")]) == 1
    err = capsys.readouterr().err  # a failed export (docs/cli.md): exit 1, the class name, one line
    assert err.startswith("onnx-compat: ConfigError: ") and len(err.strip().splitlines()) == 1, err
    assert _nothing_written(out)


def test_an_uncovered_model_type_is_refused_with_the_covered_list(tmp_path):
    T.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        tmp_path / "bert")
    with pytest.raises(UncoveredModelError) as info:
        from_pretrained_dir(tmp_path / "bert", "ctc")
    assert info.value.model_type == "bert" and "wav2vec2" in info.value.covered and "whisper" in str(info.value)
    assert "onnx_compat.export()" in str(info.value), "the way that still works is named"


def test_cli_hf_failures_exit_1_with_the_class_name(tmp_path, capsys):
    T.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        tmp_path / "bert")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["export", f"hf:{tmp_path / 'bert'}", "--out", str(out / "m.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx-compat: UncoveredModelError: ") and "export()" in err and len(err.splitlines()) == 1
    assert main(["export", f"hf:{tmp_path / 'bert'}", "--out", str(out / "m.onnx"), "--json", str(out / "no" / "r.json")]) == 2
    assert "--json" in capsys.readouterr().err and _nothing_written(out)


@pytest.mark.parametrize("model_type,saved,task,supported,message", [
    pytest.param("hubert", "ctc", "xvector", "ctc", "does not support task 'xvector'", id="hubert-has-no-xvector"),
    pytest.param("whisper", "speech-encoder", "ctc", "speech-encoder", "does not support task 'ctc'",
                 id="whisper-has-no-ctc"),
    pytest.param("wav2vec2", "ctc", "speech-encoder", "audio-encoder", "does not support task 'speech-encoder'",
                 id="wav2vec2-is-no-seq2seq"),
    pytest.param("wav2vec2", "ctc", "asr", "ctc", "unknown task 'asr'", id="unknown-task"),
])
def test_a_task_the_model_does_not_support_is_refused(tmp_path, model_type, saved, task, supported, message):
    folder = tiny.checkpoint(tmp_path / "c", model_type, saved)
    with pytest.raises(TaskError, match=message) as info:
        from_pretrained_dir(folder, task)
    assert supported in info.value.supported and info.value.task == task and isinstance(info.value, HFError)


def test_weights_that_do_not_load_are_refused(tmp_path):
    folder = tiny.checkpoint(tmp_path / "c", "wav2vec2", "ctc")
    with open(os.path.join(folder, "model.safetensors"), "wb") as fh:
        fh.write(b"not a safetensors file")
    with pytest.raises(WeightsError, match="do not load into Wav2Vec2ForCTC") as info:
        from_pretrained_dir(folder, "ctc")
    assert info.value.model_type == "wav2vec2" and info.value.task == "ctc"


def test_a_head_the_checkpoint_has_no_weights_for_is_refused(tmp_path):
    """transformers would fill the CTC head with random numbers and only warn."""
    folder = tiny.checkpoint(tmp_path / "c", "wav2vec2", "ctc", save_as="Wav2Vec2Model")
    with pytest.raises(WeightsError, match="no weights of the right shape") as info:
        from_pretrained_dir(folder, "ctc")
    assert any(k.startswith("lm_head") for k in info.value.missing)
    assert from_pretrained_dir(folder, "audio-encoder").task == "audio-encoder"  # the encoder's weights are there


def test_a_failed_export_writes_neither_the_model_nor_the_files(tmp_path):
    folder = tiny.checkpoint(tmp_path / "c", "unispeech", "ctc", tokenizer=True)
    out = tmp_path / "out"
    out.mkdir()
    code = main(["export", f"hf:{folder}", "--task", "ctc", "--out", str(out / "m.onnx"), "--exporter", "torchscript",
                     "--atol", "0", "--rtol", "0"])  # no float model meets a zero tolerance: verification fails
    assert code == 1 and _nothing_written(out), os.listdir(out)


def test_two_checkpoints_never_mix_their_runtime_files_in_one_folder(tmp_path):
    """A second checkpoint exported into a folder holding another model's runtime files is refused before
    anything is written (its files would replace some of the first's and leave the rest beside them); the
    same checkpoint again into the same folder is fine."""
    first = tiny.checkpoint(tmp_path / "w2v2", "wav2vec2", "ctc", tokenizer=True)
    second = tiny.checkpoint(tmp_path / "wavlm", "wavlm", "ctc")
    out = tmp_path / "mix"
    out.mkdir()
    assert main(["export", f"hf:{first}", "--out", str(out / "w.onnx"), "--exporter", "torchscript"]) == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    from onnx_compat.huggingface import FolderError, export_pretrained
    with pytest.raises(FolderError, match="another model's runtime files") as raised:
        export_pretrained(second, str(out / "p.onnx"), exporter="torchscript")
    assert "config.json" in str(raised.value) and "vocab.json" in str(raised.value)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before, "nothing written, nothing replaced"
    assert export_pretrained(first, str(out / "w2.onnx"), exporter="torchscript").files  # same files: no mixing


def test_an_unwritable_output_folder_is_one_line_without_temporary_names(tmp_path, capsys, monkeypatch):
    """A runtime file that cannot be written named itself as ``.onnx_compat_xxxx`` (the staged copy's name)."""
    folder = tiny.checkpoint(tmp_path / "c", "wav2vec2", "ctc")
    out = tmp_path / "out"
    out.mkdir()

    def refused(source, target, *args, **kwargs):
        raise PermissionError(13, "Permission denied", target)
    monkeypatch.setattr(files.shutil, "copyfile", refused)  # a folder that takes the model but not the files
    capsys.readouterr()
    assert main(["export", f"hf:{folder}", "--out", str(out / "m.onnx"), "--exporter", "torchscript"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("onnx-compat")]  # not tqdm's
    assert len(err) == 1 and err[0].startswith("onnx-compat: usage error: cannot write "), err
    assert str(out / "config.json") in err[0] and ".onnx_compat_" not in err[0] and _nothing_written(out)
    if os.geteuid() != 0:  # root writes into any folder
        monkeypatch.undo()
        out.chmod(0o500)
        assert main(["export", f"hf:{folder}", "--out", str(out / "m.onnx")]) == 2
        assert "is not writable" in capsys.readouterr().err


def test_a_size_of_a_dim_no_input_has_is_a_usage_error(tmp_path, capsys):
    folder = tiny.checkpoint(tmp_path / "c", "wav2vec2", "ctc")
    out = tmp_path / "out"
    out.mkdir()
    capsys.readouterr()
    assert main(["export", f"hf:{folder}", "--out", str(out / "m.onnx"), "--size", "frames=100"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("onnx-compat")]
    assert len(err) == 1 and "no input has a dim named 'frames'" in err[0], err
    assert _nothing_written(out)


def test_loading_a_checkpoint_prints_no_progress_bars(tmp_path, capfd):
    """transformers' weight-loading bars are carriage-return lines that fill a log on a pipe: kept off."""
    folder = tiny.checkpoint(tmp_path / "c", "wav2vec2", "ctc")
    capfd.readouterr()
    from_pretrained_dir(folder)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s]" not in err, err
    assert T.utils.logging.is_progress_bar_enabled(), "the progress bar setting was not put back"
