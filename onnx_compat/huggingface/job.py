"""From a transformers checkpoint folder to what ``onnx_compat.export`` takes, and the export itself.

``from_pretrained_dir`` reads ``config.json``, picks the family and the task,
loads the weights (refusing a part of the model the checkpoint has no weights
for), and builds the wrapper and its specs. Every refusal is an ``HFError``
raised before anything is exported. ``export_pretrained`` exports the job and
writes the runtime files beside the model once the export has succeeded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import nn

from ..api import export
from ..pipeline.files import check_writable
from ..spec import TensorSpec
from . import families, files
from .checkpoint_folder import first_line, quiet, read_model_type  # read_model_type: still importable from here
from .errors import ConfigError, FolderError, PreprocessorError, TaskError, UncoveredModelError, WeightsError
from .families import Family, Task
from .wrappers import AudioModel, FrameHead


@dataclass
class HFJob:
    """A checkpoint as ``export(job.model, path, job.inputs, job.outputs)`` takes it."""

    model: nn.Module
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    fixed: Dict[str, int]  # sizes the model takes exactly ({"time": 3000, "features": 80} for Whisper)
    files: List[str]  # runtime files in the checkpoint folder, to copy beside the model
    folder: str
    task: str
    model_type: str
    metadata: Dict[str, str] = field(default_factory=dict)


def from_pretrained_dir(folder, task: Optional[str] = None) -> HFJob:
    """The job for ``task`` (default: the one the checkpoint's architecture was saved for)."""
    folder = os.fspath(folder)
    model_type = read_model_type(folder, task)
    family = families.family_of(model_type)
    if family is None:
        raise UncoveredModelError(f"{folder}: model type {model_type!r} is not covered; covered: "
                                  f"{', '.join(families.COVERED)}. Any model still exports from Python: load it "
                                  "with transformers, declare its TensorSpecs and call onnx_compat.export() "
                                  "(or write a factory for `onnx-compat export MODULE:FACTORY`)",
                                  covered=families.COVERED, folder=folder,
                                  task=task, model_type=model_type)
    config = _load("config", folder, task, model_type)
    chosen = choose_task(family, model_type, task, getattr(config, "architectures", None), folder)
    extractor = _load("extractor", folder, chosen.name, model_type)
    part = load_part(folder, chosen, model_type)
    for fix in family.fixes:
        fix.install(part)
    frame_head = isinstance(chosen.head, FrameHead)
    shapes = family.input.shapes(part, config, extractor, chosen, frame_head)
    problem = family.input.extractor_disagrees(extractor, shapes.fixed)
    if problem:
        raise PreprocessorError(f"{folder}: {problem}", folder=folder, task=chosen.name, model_type=model_type)
    outputs = output_specs(chosen, shapes)
    metadata = {"hf.model_type": model_type, "hf.task": chosen.name, "hf.class": type(part).__name__,
                "hf.fixed": json.dumps(shapes.fixed), "hf.attention_mask": str(shapes.feeding.mask).lower()}
    wrapper = AudioModel(part, shapes.feeding, chosen.head, family.input.length_function)
    return HFJob(wrapper.eval(), shapes.inputs, outputs, shapes.fixed,
                 files.runtime_files(folder), folder, chosen.name, model_type, metadata)


def choose_task(family: Family, model_type: str, task: Optional[str], architectures, folder: str) -> Task:
    supported = families.supported_tasks(family, model_type)
    fields = dict(supported=supported, folder=folder, task=task, model_type=model_type)
    if task is None:
        task = families.task_from_architectures(family, model_type, architectures)
        if task is None:
            raise TaskError(f"{folder}: name a task; the architectures {list(architectures or [])} do not imply one "
                            f"of {model_type}'s: {', '.join(supported)}", **fields)
    if families.task_named(task) is None:
        raise TaskError(f"unknown task {task!r}; tasks: {', '.join(families.TASK_NAMES)}", **fields)
    if task not in supported:
        raise TaskError(f"{folder}: model type {model_type!r} does not support task {task!r}; it supports "
                        f"{', '.join(supported)}", **fields)
    return families.task_named(task)


def _load(what: str, folder: str, task: Optional[str], model_type: str):
    """The config (``AutoConfig``), or the feature extractor when the folder has a preprocessor config."""
    import transformers
    fields = dict(folder=folder, task=task, model_type=model_type)
    if what == "config":
        try:
            return transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - whatever transformers raises, one error names the file
            raise ConfigError(f"{folder}/config.json does not load in transformers "
                              f"{transformers.__version__}: {first_line(exc)}", **fields) from exc
    if not os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        return None
    try:
        return transformers.AutoFeatureExtractor.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise PreprocessorError(f"{folder}/preprocessor_config.json does not load: {first_line(exc)}",
                                **fields) from exc


def load_part(folder: str, task: Task, model_type: str) -> nn.Module:
    """The model of the task's class with the checkpoint's weights; its encoder for ``speech-encoder``.

    transformers fills weights a checkpoint lacks with random values and only
    warns; a part to export with such weights (a CTC head on a pretraining
    checkpoint) is refused. Weights outside the part (a decoder) may be missing.
    """
    import transformers
    fields = dict(folder=folder, task=task.name, model_type=model_type)
    cls = getattr(transformers, families.model_class_name(task, model_type))
    try:
        with quiet(transformers):  # its load report would repeat, as a table, what the error below says
            model, info = cls.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    except Exception as exc:  # noqa: BLE001
        raise WeightsError(f"{folder}: the weights do not load into {cls.__name__}: {first_line(exc)}",
                           **fields) from exc
    part = model.get_encoder() if task.encoder else model
    inside = {id(p) for p in part.parameters()} | {id(b) for b in part.buffers()}
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    missing = sorted(k for k in info.get("missing_keys", ()) if k in named and id(named[k]) in inside)
    mismatched = [str(m[0]) if isinstance(m, (tuple, list)) else str(m) for m in info.get("mismatched_keys", ())]
    if missing or mismatched:
        what = missing or mismatched
        raise WeightsError(f"{folder}: the checkpoint has no weights of the right shape for {len(what)} tensor(s) of "
                           f"{type(part).__name__} ({', '.join(what[:4])}{', ...' if len(what) > 4 else ''}); "
                           f"task {task.name!r} needs a checkpoint trained for it", missing=what, **fields)
    return part.eval()


def output_specs(task: Task, shapes) -> List[TensorSpec]:
    """``output`` [B, frames, C] (+ ``output:size1``) for frame heads, ``logits``/``embeddings`` otherwise."""
    batch = shapes.inputs[0].dims[0]
    if isinstance(task.head, FrameHead):
        if shapes.frames is not None:
            return [TensorSpec("output", [batch, shapes.frames, None], lengths=[1])]
        extra = [TensorSpec("output:size1", [batch], torch.int32)] if shapes.lengths else []
        return [TensorSpec("output", [batch, None, None])] + extra
    if task.name == "xvector":
        return [TensorSpec("embeddings", [batch, None]), TensorSpec("logits", [batch, None])]
    return [TensorSpec("logits", [batch, None])]


def export_pretrained(folder, path, task: Optional[str] = None, *, copy_files: bool = True, **export_kwargs):
    """Export the checkpoint in ``folder`` to ``path`` and write its runtime files beside it.

    ``export_kwargs`` go to ``onnx_compat.export`` (``exporter``, ``atol``,
    ...); ``metadata`` is merged with the job's. The runtime files are copied
    before the export under temporary names and renamed once it has passed:
    a failed export leaves neither the model nor the files. A folder that holds another model's runtime
    files is refused first (``FolderError``): one folder, one model's files. ``contract="sherpa-onnx/whisper"``:
    ``path`` is a folder that gets sherpa-onnx's two Whisper graphs and tokens.txt (``whisper.export_whisper``).
    """
    if export_kwargs.get("contract") == "sherpa-onnx/whisper":  # two graphs and tokens.txt: its own writer
        from .whisper import export_pretrained_whisper
        return export_pretrained_whisper(folder, path, task, copy_files=copy_files, **export_kwargs)
    job = from_pretrained_dir(folder, task)
    export_kwargs["metadata"] = {**job.metadata, **dict(export_kwargs.get("metadata") or {})}
    destination = os.path.dirname(check_writable(path))  # before any runtime file is staged there
    copies = job.files if copy_files else []
    others = files.foreign_files(copies, destination) if copies else []
    if others:
        raise FolderError(f"{destination} holds another model's runtime files ({', '.join(others)}): "
                          f"{job.model_type}'s files from {job.folder} would be mixed with them; export into "
                          "another folder, or remove them first", others=others, folder=job.folder, task=job.task,
                          model_type=job.model_type)
    with files.staged_copies(copies, destination) as staged:
        report = export(job.model, path, job.inputs, job.outputs, **export_kwargs)
        report.files += files.commit(staged)  # beside the files the export's steps wrote (a contract's tokens)
    return report
