"""``onnx-compat export hf:DIR`` against ``optimum-cli export onnx`` on the same tiny checkpoints, side by side.

    benchmarks/make_optimum_env.sh /work/scratch/hf/venv      # once: optimum's venv, outside the repo
    .venv/bin/python benchmarks/hf_vs_optimum.py --optimum-python /work/scratch/hf/venv/bin/python [--same-env]

``--optimum-python``: an interpreter whose environment has ``optimum-onnx``
(optimum does not run with transformers 5; its venv has the transformers 4
it accepts, and torch 2.13.0; ``make_optimum_env.sh`` builds it with the
versions the table names). The checkpoints are random-init tiny models
built by that interpreter (so both transformers releases read them). Each
tool runs as its own command, timed as a user waits for it (start to end),
``--rounds`` times in alternating order; the table has the medians and our
ratio to optimum's, of the wall time and of the command's CPU time (user +
system: on a machine other jobs load, the wall time grows with their load
and the CPU time far less). Ours is ``onnx-compat export hf:DIR`` run by this
interpreter (our test environment, transformers 5) and, with
``--same-env``, also by optimum's interpreter from this checkout (that
environment then needs our dependencies, ``wrapt`` and ``onnxscript``): the
same transformers and torch for both tools, so the two differ only in what
the tools do. Importing transformers 5 takes about 0.3 s longer than
transformers 4 on this machine, which the first row pays and optimum does not.
Our package's bytecode is compiled first, as ``pip install`` does; an
editable checkout under ``PYTHONDONTWRITEBYTECODE`` would compile every
module of ours in every process, and optimum's never.
Then both models get the same padded batch at a batch size and lengths
neither export saw, made by the checkpoint's own feature extractor, and are
compared with transformers' eager model given the attention mask where its
feature extractor returns one ("masked eager"), on the valid frames (each
sequence's frames by the model's own length function). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(__file__))
from readme_block import add_write_option, write_marked  # noqa: E402

from onnx_compat.huggingface import families, from_pretrained_dir, tiny  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/huggingface.md",
             "needs": "an optimum venv (`--optimum-python`, built by `benchmarks/make_optimum_env.sh`)"}

# name: (model type, our task, optimum's task, optimum's file, transformers' reference class, output attribute)
MODELS = {
    "wav2vec2 CTC": ("wav2vec2", "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "HuBERT CTC": ("hubert", "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "WavLM CTC": ("wavlm", "ctc", "automatic-speech-recognition", "model.onnx", "AutoModelForCTC", "logits"),
    "Whisper encoder": ("whisper", "speech-encoder", "automatic-speech-recognition", "encoder_model.onnx",
                        "AutoModel", "last_hidden_state"),
    "AST classification": ("audio-spectrogram-transformer", "audio-classification", "audio-classification",
                           "model.onnx", "AutoModelForAudioClassification", "logits"),
    "wav2vec2-conformer CTC": ("wav2vec2-conformer", "ctc", "automatic-speech-recognition", "model.onnx",
                               "AutoModelForCTC", "logits"),
    "Speech2Text encoder": ("speech_to_text", "speech-encoder", "automatic-speech-recognition", "encoder_model.onnx",
                            "AutoModel", "last_hidden_state"),
}
_BUILD = """
import json, sys, torch, transformers as T
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
getattr(T, spec["cls"])(getattr(T, spec["config_cls"])(**spec["config"])).save_pretrained(sys.argv[2])
getattr(T, spec["fe_cls"])(**spec["fe"]).save_pretrained(sys.argv[2])
"""


def checkpoint_spec(model_type: str, task: str) -> dict:
    """``tiny.py``'s checkpoint of ``model_type`` for ``task``, as the other interpreter builds it."""
    config_cls, config, fe_cls, fe = tiny.TINY[model_type]
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES as SEQ2SEQ
    # optimum exports a whole sequence-to-sequence model (the encoder is one of its files)
    cls = SEQ2SEQ[model_type] if task == "speech-encoder" else \
        families.model_class_name(families.task_named(task), model_type)
    return {"cls": cls, "config_cls": config_cls, "config": dict(config, **tiny.TASK_CONFIG.get(task, {})),
            "fe_cls": fe_cls, "fe": fe}


LENGTHS = [7013, 4102, 5631]  # samples of the padded batch: B=3 and lengths no export saw


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(command, env) -> tuple:
    """Wall time (what a user waits) and the command's CPU time (user + system): on a shared machine the wall
    time grows with the other jobs' load, the CPU time far less, so the two ratios together tell the tools'
    own cost from the machine's."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return time.perf_counter() - t0, _children_cpu() - cpu0


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
            "lengths": any(o.name.endswith(":size1") for o in outputs) if frames is not None else None,
            "mask": any(n in ("attention_mask", "data:size1") for n in names), "frames_dim": frames_dim}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours_command(python: str, folder: str, task: str, out: str, exporter: str) -> list:
    """``onnx-compat export hf:DIR`` as the console script runs it (``onnx_compat.cli:main``)."""
    return [python, "-m", "onnx_compat.cli", "export", f"hf:{folder}", "--task", task, "--out", out,
            "--exporter", exporter]


def prepare_ours(python: str) -> dict:
    """The environment ``python`` runs our checkout in, its bytecode compiled (as an installed package's is)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)
    missing = subprocess.run([python, "-c", "import importlib.util as u; print(' '.join(m for m in ('wrapt', "
                              "'onnxscript', 'onnxruntime', 'transformers') if u.find_spec(m) is None))"],
                             env=env, capture_output=True, text=True, check=True).stdout.split()
    if missing:
        raise SystemExit(f"{python} lacks {', '.join(missing)}: --same-env runs our checkout there")
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(ROOT, "onnx_compat")], env=env, check=True,
                   capture_output=True)
    return env


def run_one(name, spec, work, optimum_python, exporter, rounds=5, ours=()) -> list:
    """Each tool ``rounds`` times, in alternating order (ours first in even rounds), the median wall time;
    a burst of load on the shared machine then falls on both alike."""
    model_type, task, opt_task, opt_file, ref_cls, attr = spec
    folder = os.path.join(work, name.replace(" ", "_"))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([optimum_python, "-c", _BUILD, json.dumps(checkpoint_spec(model_type, task)), folder], env=env,
                   check=True, capture_output=True)
    batch, expected, frames = reference(folder, ref_cls, attr, task == "speech-encoder")
    tools = []
    for label, python, ours_env in ours:  # (label, interpreter, its environment from prepare_ours)
        out = os.path.join(folder + f"_ours{len(tools)}", "model.onnx")
        os.makedirs(os.path.dirname(out))
        tools.append((label, ours_command(python, folder, task, out, exporter), out, ours_env))
    cli = os.path.join(os.path.dirname(optimum_python), "optimum-cli")
    for k, (label, extra) in enumerate(optimum_attempts(folder, task)):
        opt_dir = folder + f"_optimum{k}"
        tools.append((label, [cli, "export", "onnx", "--model", folder, "--task", opt_task, *extra, opt_dir],
                      os.path.join(opt_dir, opt_file), env))
    seconds = {label: [] for label, _, _, _ in tools}
    failed = {}
    for r in range(rounds):
        for label, command, _, tool_env in (tools if r % 2 == 0 else tools[::-1]):
            if label in failed:
                continue
            try:
                seconds[label].append(timed(command, tool_env))
            except RuntimeError as exc:
                failed[label] = str(exc).split("failed: ")[-1]
    rows = []
    for label, _, path, _ in tools:
        if label in failed:
            rows.append((label, float("nan"), {"error": failed[label]}))
        else:
            cpu = statistics.median(c for _, c in seconds[label])
            rows.append((label, statistics.median(w for w, _ in seconds[label]),
                         dict(measure(path, batch, expected, frames), cpu=cpu)))
    return rows


def optimum_attempts(folder: str, task: str):
    """optimum as a user runs it; where the model takes a fixed length, also told that length (optimum's dummy
    input is 3,000 frames whatever the config says: the user must know the number; ours reads it from the model)."""
    yield "optimum", []
    fixed = from_pretrained_dir(folder, task).fixed.get("time")
    if fixed is not None and task == "speech-encoder":
        yield f"optimum --nb_max_frames {fixed}", ["--nb_max_frames", str(fixed)]


def table(results) -> str:
    lines = ["| model | tool | export s (median) | ours / optimum | CPU s (median), ours / optimum | nodes "
             "| max abs err, padded B=3 at new lengths | lengths out | mask/lengths in | output frames dim |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for name, rows in results:
        peer = [(s, m["cpu"]) for tool, s, m in rows if not tool.startswith("onnx-compat") and "error" not in m]
        for tool, seconds, m in rows:
            if "error" in m:
                lines.append(f"| {name} | {tool} | - | | | - | fails: {m['error']} | | | |")
                continue
            ours = tool.startswith("onnx-compat") and peer
            ratio = f"**{seconds / min(w for w, _ in peer):.2f}x**" if ours else ""
            cpu = f"{m['cpu']:.2f}" + (f" ({m['cpu'] / min(c for _, c in peer):.2f}x)" if ours else "")
            yes = {True: "yes", False: "no", None: "- (no frames)"}
            lines.append(f"| {name} | {tool} | {seconds:.2f} | {ratio} | {cpu} | {m['nodes']} | {m['err']:.2e} | "
                         f"{yes[m['lengths']]} | {yes[m['mask']]} | {m['frames_dim']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimum-python", required=True, help="python of a venv with optimum-onnx (transformers 4)")
    p.add_argument("--exporter", default="auto", help="ours: auto (the default), dynamo or torchscript")
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--rounds", type=int, default=5, help="runs of each tool, alternating which goes first")
    p.add_argument("--same-env", action="store_true", help="also run ours in optimum's environment (same "
                   "transformers and torch; it needs wrapt and onnxscript)")
    add_write_option(p, "hf-vs-optimum", "docs/huggingface.md")
    args = p.parse_args(argv)
    ours = [("onnx-compat", sys.executable)] + \
        ([("onnx-compat, optimum's env", args.optimum_python)] if args.same_env else [])
    ours = [(label, python, prepare_ours(python)) for label, python in ours]
    with tempfile.TemporaryDirectory(prefix="hf_vs_optimum_") as work:
        results = [(name, run_one(name, MODELS[name], work, args.optimum_python, args.exporter,
                                   args.rounds, ours))
                   for name in args.models]
    text = table(results)
    print(text)
    if args.write:
        write_marked(args.write, text, "hf-vs-optimum" if args.exporter == "auto" else f"hf-vs-optimum-{args.exporter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
