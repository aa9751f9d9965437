"""``onnx-compat export hf:DIR`` against ``optimum-cli export onnx`` on the same tiny checkpoints, side by side.

    .venv/bin/python benchmarks/hf_vs_optimum.py --optimum-python /work/scratch/hf/venv/bin/python

``--optimum-python``: an interpreter whose environment has ``optimum-onnx``
(optimum does not run with transformers 5; its venv has the transformers 4
it accepts, and torch 2.13.0). The checkpoints are random-init tiny models
built by that interpreter (so both transformers releases read them). Each
tool runs as its own command, timed as a user waits for it (start to end).
Then both models get the same padded batch at a batch size and lengths
neither export saw, made by the checkpoint's own feature extractor, and are
compared with transformers' eager model given the attention mask where its
feature extractor returns one ("masked eager"), on the valid frames (each
sequence's frames by the model's own length function). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

_W2V = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "conv_dim": [16, 16], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 2, "vocab_size": 12, "feat_extract_norm": "layer"}
_MASKED = {"return_attention_mask": True}
# name: (checkpoint spec, our task, optimum's task, optimum's file, transformers' reference class, output attribute)
MODELS = {
    "wav2vec2 CTC": ({"cls": "Wav2Vec2ForCTC", "config_cls": "Wav2Vec2Config", "config": dict(_W2V, do_stable_layer_norm=True),
                      "fe_cls": "Wav2Vec2FeatureExtractor", "fe": _MASKED},
                     "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "HuBERT CTC": ({"cls": "HubertForCTC", "config_cls": "HubertConfig", "config": _W2V,
                    "fe_cls": "Wav2Vec2FeatureExtractor", "fe": _MASKED},
                   "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "WavLM CTC": ({"cls": "WavLMForCTC", "config_cls": "WavLMConfig", "config": dict(_W2V, num_buckets=16, max_bucket_distance=20),
                   "fe_cls": "Wav2Vec2FeatureExtractor", "fe": _MASKED},
                  "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "Whisper encoder": ({"cls": "WhisperForConditionalGeneration", "config_cls": "WhisperConfig", "config": {
        "vocab_size": 60, "num_mel_bins": 20, "d_model": 32, "encoder_layers": 2, "decoder_layers": 1,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "max_source_positions": 50, "max_target_positions": 20, "decoder_start_token_id": 1, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2}, "fe_cls": "WhisperFeatureExtractor",
        "fe": {"feature_size": 20, "chunk_length": 1}},
        "speech-encoder", "automatic-speech-recognition", "encoder_model.onnx", "AutoModel", "last_hidden_state"),
    "AST classification": ({"cls": "ASTForAudioClassification", "config_cls": "ASTConfig", "config": {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "max_length": 64,
        "num_mel_bins": 32, "patch_size": 8, "frequency_stride": 8, "time_stride": 8, "num_labels": 3},
        "fe_cls": "ASTFeatureExtractor", "fe": {"num_mel_bins": 32, "max_length": 64}},
        "audio-classification", "audio-classification", "model.onnx", "AutoModelForAudioClassification", "logits"),
}
_BUILD = """
import json, sys, torch, transformers as T
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
getattr(T, spec["cls"])(getattr(T, spec["config_cls"])(**spec["config"])).save_pretrained(sys.argv[2])
getattr(T, spec["fe_cls"])(**spec["fe"]).save_pretrained(sys.argv[2])
"""
LENGTHS = [7013, 4102, 5631]  # samples of the padded batch: B=3 and lengths no export saw


def timed(command, env) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return time.perf_counter() - t0


def reference(folder: str, cls_name: str, attr: str, encoder: bool):
    """transformers' pipeline: the feature extractor's padded batch and the eager outputs with its mask."""
    import transformers
    extractor = transformers.AutoFeatureExtractor.from_pretrained(folder)
    gen = np.random.default_rng(0)
    audio = [gen.standard_normal(n).astype(np.float32) * 0.3 for n in LENGTHS]
    fixed = hasattr(extractor, "nb_max_frames")
    batch = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="pt", return_attention_mask=True,
                      padding="max_length" if fixed else True)
    model = getattr(transformers, cls_name).from_pretrained(folder).eval()
    part = model.get_encoder() if encoder else model
    masked = bool(getattr(extractor, "return_attention_mask", False))
    with torch.no_grad():
        out = getattr(part(**{k: v for k, v in batch.items() if k != "attention_mask" or masked}), attr).numpy()
        frames = part._get_feat_extract_output_lengths(batch["attention_mask"].sum(-1)).numpy() \
            if out.ndim == 3 and hasattr(part, "_get_feat_extract_output_lengths") else None
    return batch, out, frames


def feeds_for(sess, batch) -> dict:
    """What each graph takes of the batch: ours data/data:size1 ([B, T, F]), optimum's transformers' names."""
    values = batch["input_values"] if "input_values" in batch else batch["input_features"]
    feeds = {}
    for spec in sess.get_inputs():
        if spec.name == "data":
            static = spec.shape[1] if len(spec.shape) == 3 and isinstance(spec.shape[1], int) else None
            feeds["data"] = (values.transpose(1, 2) if static and static != values.shape[1] else values).numpy()
        elif spec.name == "data:size1":
            feeds[spec.name] = batch["attention_mask"].sum(-1).numpy().astype(np.int32)
        elif spec.name == "attention_mask":
            feeds[spec.name] = batch["attention_mask"].numpy().astype(np.int64)
        else:
            feeds[spec.name] = values.numpy()
    return feeds


def measure(path: str, batch, expected, frames) -> dict:
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out = sess.run(None, feeds_for(sess, batch))[0]
    valid = np.ones(expected.shape, dtype=bool)
    if frames is not None:
        valid = np.broadcast_to(np.arange(expected.shape[1])[None, :, None] < frames[:, None, None], expected.shape)
    err = float(np.abs(out[valid] - expected[valid]).max()) if out.shape == expected.shape else float("nan")
    names = [i.name for i in sess.get_inputs()]
    outputs = sess.get_outputs()
    frames_dim = outputs[0].shape[1] if len(outputs[0].shape) == 3 else "-"
    return {"nodes": len(onnx.load(path).graph.node), "err": err, "inputs": names,
            "lengths": any(o.name.endswith(":size1") for o in outputs),
            "mask": any(n in ("attention_mask", "data:size1") for n in names), "frames_dim": frames_dim}


def run_one(name, spec, work, optimum_python, exporter) -> list:
    ckpt_spec, task, opt_task, opt_file, ref_cls, attr = spec
    folder = os.path.join(work, name.replace(" ", "_"))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([optimum_python, "-c", _BUILD, json.dumps(ckpt_spec), folder], env=env, check=True,
                   capture_output=True)
    batch, expected, frames = reference(folder, ref_cls, attr, task == "speech-encoder")
    rows = []
    ours = os.path.join(folder + "_ours", "model.onnx")
    os.makedirs(os.path.dirname(ours))
    seconds = timed([sys.executable, "-m", "onnx_compat.huggingface.cli", f"hf:{folder}", "--task", task, "--out",
                     ours, "--exporter", exporter], env)
    rows.append(("onnx-compat", seconds, measure(ours, batch, expected, frames)))
    opt_dir = folder + "_optimum"
    try:
        seconds = timed([os.path.join(os.path.dirname(optimum_python), "optimum-cli"), "export", "onnx", "--model",
                         folder, "--task", opt_task, opt_dir], env)
        rows.append(("optimum", seconds, measure(os.path.join(opt_dir, opt_file), batch, expected, frames)))
    except RuntimeError as exc:
        rows.append(("optimum", float("nan"), {"error": str(exc)}))
    return rows


def table(results) -> str:
    lines = ["| model | tool | export s | nodes | max abs err, padded B=3 at new lengths | lengths out | mask/lengths in | "
             "output frames dim |", "|---|---|---:|---:|---:|---|---|---|"]
    for name, rows in results:
        for tool, seconds, m in rows:
            if "error" in m:
                lines.append(f"| {name} | {tool} | - | - | fails: {m['error']} | | | |")
                continue
            lines.append(f"| {name} | {tool} | {seconds:.1f} | {m['nodes']} | {m['err']:.2e} | "
                         f"{'yes' if m['lengths'] else 'no'} | {'yes' if m['mask'] else 'no'} | {m['frames_dim']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimum-python", required=True, help="python of a venv with optimum-onnx (transformers 4)")
    p.add_argument("--exporter", default="auto", help="ours: auto (the default), dynamo or torchscript")
    p.add_argument("--models", nargs="*", default=list(MODELS))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf_vs_optimum_") as work:
        results = [(name, run_one(name, MODELS[name], work, args.optimum_python, args.exporter)) for name in args.models]
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
