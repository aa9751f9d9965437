"""What we know about each family of transformers audio models: one declarative entry each.

A ``Family`` names its model types (``config.json``'s ``model_type``), the
kind of input its models take and the tasks we export. A ``Task`` names the
transformers auto mapping that gives the model class for a model type (a
type missing from the mapping does not support the task), the head that
picks the outputs, and whether the encoder of a sequence-to-sequence model
is the part exported. The input kinds turn the config, the feature extractor
and the loaded model into the ``Feeding`` of the wrapper, the ``TensorSpec``
of ``data`` and the sizes that are fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..spec import Dim, TensorSpec
from .wrappers import LENGTH_FUNCTION, Feeding, FrameHead, UpsampleToInputLength, UtteranceHead, XVectorHead

EXAMPLE_FRAMES = 24  # output frames of the export example (verification goes from about half to 1.4 times)


def _no_min(config) -> int:
    return 2


def _tdnn_min(config) -> int:
    """Frames the x-vector TDNN stack needs for two output frames (its std needs two)."""
    return 2 + sum(d * (k - 1) for k, d in zip(config.tdnn_kernel, config.tdnn_dilation))


@dataclass(frozen=True)
class Task:
    name: str
    mapping: str  # transformers.models.auto.modeling_auto.<mapping>: model_type -> class name
    head: object
    encoder: bool = False  # export model.get_encoder() of a sequence-to-sequence model
    min_frames: Callable = _no_min  # output frames a sequence needs (before the head)
    inferred_from: Tuple[str, ...] = ()  # more mappings whose architectures imply this task
    about: str = ""


TASKS: Tuple[Task, ...] = (
    Task("ctc", "MODEL_FOR_CTC_MAPPING_NAMES", FrameHead("logits"), about="CTC logits per frame"),
    Task("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", UtteranceHead(),
         about="one label distribution per sequence"),
    Task("audio-frame-classification", "MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES", FrameHead("logits"),
         about="labels per frame (diarization)"),
    Task("xvector", "MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES", XVectorHead(), min_frames=_tdnn_min,
         about="speaker embeddings and logits"),
    Task("audio-encoder", "MODEL_MAPPING_NAMES", FrameHead("last_hidden_state"),
         inferred_from=("MODEL_FOR_PRETRAINING_MAPPING_NAMES",), about="the encoder's last hidden state"),
    Task("speech-encoder", "MODEL_MAPPING_NAMES", FrameHead("last_hidden_state"), encoder=True,
         inferred_from=("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",),
         about="the encoder of a speech sequence-to-sequence model"),
)
TASK_NAMES = tuple(t.name for t in TASKS)


@dataclass
class Shapes:
    """What an input kind decided for one model: the wrapper's feeding, the input specs, the fixed sizes."""

    feeding: Feeding
    inputs: List[TensorSpec]
    frames: Optional[Dim]  # the output frames dim; None when the frames are static
    lengths: bool  # data:size1 is an input (and frame outputs get output:size1)
    fixed: Dict[str, int] = field(default_factory=dict)


def smallest_input(part: nn.Module, frames: int, function: str = LENGTH_FUNCTION, limit: int = 1 << 26) -> int:
    """The shortest input the model's length function maps to at least ``frames`` frames."""
    def out(n: int) -> int:
        return int(getattr(part, function)(torch.tensor([n]))[0])
    high = 1
    while out(high) < frames:
        high *= 2
        if high > limit:
            raise ValueError(f"no input of up to {limit} gives {frames} frames")
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if out(mid) >= frames else (mid, high)
    return high


def _pad_value(extractor) -> float:
    return float(getattr(extractor, "padding_value", 0.0) or 0.0)


@dataclass(frozen=True)
class Samples:
    """Raw audio ``[B, samples]`` (``input_values``), as the wav2vec2 feature extractor pads it.

    The mask follows transformers' rule: passed only where the feature
    extractor returns one (without a preprocessor config: models whose conv
    stack is layer-normed); group-normed models take zero-padded audio alone.
    """

    arg: str = "input_values"
    length_function: str = LENGTH_FUNCTION

    def shapes(self, part, config, extractor, task: Task, frame_head: bool) -> Shapes:
        if extractor is not None and hasattr(extractor, "return_attention_mask"):
            mask = bool(extractor.return_attention_mask)
        else:
            mask = getattr(config, "feat_extract_norm", "layer") == "layer"
        need = task.min_frames(config)
        samples = Dim("samples", min=smallest_input(part, need),
                      example=smallest_input(part, max(EXAMPLE_FRAMES, 2 * need)))
        data = TensorSpec("data", [Dim("batch"), samples], lengths=[1])
        return Shapes(Feeding(self.arg, _pad_value(extractor), mask), [data], Dim("frames"), True)

    def extractor_disagrees(self, extractor, fixed: Dict[str, int]) -> Optional[str]:
        return None  # any length goes


@dataclass(frozen=True)
class Features:
    """Features ``[B, T, F]`` of any length with an attention mask (Wav2Vec2-BERT, Speech2Text, Parakeet)."""

    size: Callable  # config -> F
    arg: str = "input_features"
    length_function: str = LENGTH_FUNCTION

    def shapes(self, part, config, extractor, task: Task, frame_head: bool) -> Shapes:
        need, fn = task.min_frames(config), self.length_function
        time = Dim("time", min=smallest_input(part, need, fn),
                   example=smallest_input(part, max(EXAMPLE_FRAMES, 2 * need), fn))
        size = int(self.size(config))
        data = TensorSpec("data", [Dim("batch"), time, size], lengths=[1])
        return Shapes(Feeding(self.arg, _pad_value(extractor), True), [data], Dim("frames"), True, {"features": size})

    def extractor_disagrees(self, extractor, fixed: Dict[str, int]) -> Optional[str]:
        return None  # any length goes


@dataclass(frozen=True)
class FixedFeatures:
    """Features of a fixed number of frames (Whisper's 30 s, AST's 1,024), taken from the model.

    ``frames(part, config)``: what the model's weights require; the feature
    extractor's ``extractor_frames`` attribute must agree. Frame outputs get
    ``data:size1`` -> ``output:size1`` as plain tensors (the time axis is
    static, so it carries no named lengths) where ``lengths``; a model without
    frame outputs does not use the lengths, so it has none; nor does a model
    whose output frames are patches with no length function (AST).
    """

    frames: Callable  # (part, config) -> T
    size: Callable  # config -> F
    extractor_frames: str
    arg: str = "input_features"
    channels_first: bool = False
    length_function: str = LENGTH_FUNCTION
    lengths: bool = True

    def shapes(self, part, config, extractor, task: Task, frame_head: bool) -> Shapes:
        frames, size = int(self.frames(part, config)), int(self.size(config))
        batch = Dim("batch")
        inputs = [TensorSpec("data", [batch, frames, size])]
        lengths = frame_head and self.lengths
        if lengths:
            inputs.append(TensorSpec("data:size1", [batch], torch.int32, values=(1, frames + 1)))
        feeding = Feeding(self.arg, None, False, self.channels_first)
        return Shapes(feeding, inputs, None, lengths, {"time": frames, "features": size})

    def extractor_disagrees(self, extractor, fixed: Dict[str, int]) -> Optional[str]:
        said = getattr(extractor, self.extractor_frames, None) if extractor is not None else None
        if said is not None and int(said) != fixed["time"]:
            return (f"preprocessor_config.json gives {self.extractor_frames}={said} frames, but the model takes "
                    f"exactly {fixed['time']}")
        return None


def _whisper_frames(part, config) -> int:
    encoder = part if hasattr(part, "conv1") else part.encoder
    return config.max_source_positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]


@dataclass(frozen=True)
class Family:
    name: str
    model_types: Tuple[str, ...]
    input: object
    tasks: Tuple[str, ...]
    fixes: Tuple[object, ...] = ()  # installed on the loaded model: export-time hooks for code that bakes sizes


_ENCODER_TASKS = ("ctc", "audio-classification", "audio-frame-classification", "xvector", "audio-encoder")

FAMILIES: Tuple[Family, ...] = (
    Family("wav2vec2-style encoders on raw audio",
           ("wav2vec2", "hubert", "wavlm", "data2vec-audio", "unispeech", "unispeech-sat", "wav2vec2-conformer"),
           Samples(), _ENCODER_TASKS),
    Family("SEW and SEW-D: wav2vec2-style, frames squeezed in the encoder", ("sew", "sew-d"), Samples(),
           _ENCODER_TASKS, fixes=(UpsampleToInputLength(),)),
    Family("Wav2Vec2-BERT", ("wav2vec2-bert",), Features(lambda c: c.feature_projection_input_dim), _ENCODER_TASKS),
    Family("Parakeet and LASR CTC (FastConformer over features)", ("parakeet_ctc", "lasr_ctc"),
           Features(lambda c: c.encoder_config.num_mel_bins, length_function="_get_subsampling_output_length"),
           ("ctc",)),
    Family("Speech2Text", ("speech_to_text",), Features(lambda c: c.input_feat_per_channel * c.input_channels),
           ("speech-encoder",)),
    Family("Whisper", ("whisper",), FixedFeatures(_whisper_frames, lambda c: c.num_mel_bins, "nb_max_frames",
                                                  channels_first=True), ("speech-encoder", "audio-classification")),
    Family("Audio Spectrogram Transformer", ("audio-spectrogram-transformer",),
           FixedFeatures(lambda part, c: c.max_length, lambda c: c.num_mel_bins, "max_length", arg="input_values",
                         lengths=False),
           ("audio-classification", "audio-encoder")),
)

COVERED: Tuple[str, ...] = tuple(sorted(t for f in FAMILIES for t in f.model_types))


def family_of(model_type: str) -> Optional[Family]:
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def task_named(name: str) -> Optional[Task]:
    return next((t for t in TASKS if t.name == name), None)


def _mapping(name: str) -> Dict[str, str]:
    from transformers.models.auto import modeling_auto
    return getattr(modeling_auto, name, {})


def model_class_name(task: Task, model_type: str) -> Optional[str]:
    return _mapping(task.mapping).get(model_type)


def supported_tasks(family: Family, model_type: str) -> List[str]:
    """The family's tasks that transformers has a class for with this model type."""
    return [name for name in family.tasks if model_class_name(task_named(name), model_type)]


def task_from_architectures(family: Family, model_type: str, architectures) -> Optional[str]:
    """The task a checkpoint was saved for (``Wav2Vec2ForCTC`` -> ``ctc``), when it is one we export."""
    for arch in architectures or ():
        for name in supported_tasks(family, model_type):
            task = task_named(name)
            if any(_mapping(m).get(model_type) == arch for m in (task.mapping,) + task.inferred_from):
                return name
    return None
