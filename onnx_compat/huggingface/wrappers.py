"""The modules exported for a transformers audio model: our I/O convention around its own forward.

``AudioModel.forward(data, [lengths])`` does what a transformers processor
and the caller would: padded positions get the feature extractor's padding
value (so whatever a runtime pads with, the model sees what it saw in
training), the attention mask is built from the lengths where the model
takes one, and the output lengths come from the model's own length function
(``_get_feat_extract_output_lengths``). A head picks the outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn


@dataclass(frozen=True)
class Feeding:
    """How ``data`` and its lengths become the model's keyword arguments.

    ``arg``: the forward argument (``input_values``/``input_features``).
    ``pad_value``: written at padded positions (None: left as given).
    ``mask``: pass ``attention_mask`` (transformers' rule: only where the feature extractor returns one).
    ``channels_first``: the model wants ``[B, F, T]`` (Whisper) where ``data`` is ``[B, T, F]``.
    """

    arg: str
    pad_value: Optional[float] = None
    mask: bool = False
    channels_first: bool = False

    def kwargs(self, data: torch.Tensor, lengths: Optional[torch.Tensor]) -> dict:
        kwargs = {}
        if lengths is not None:
            valid = torch.arange(data.shape[1], device=data.device)[None, :] < lengths[:, None]
            if self.pad_value is not None:
                shaped = valid.reshape(valid.shape + (1,) * (data.dim() - 2))
                data = torch.where(shaped, data, torch.full_like(data, self.pad_value))
            if self.mask:
                kwargs["attention_mask"] = valid.to(torch.long)
        kwargs[self.arg] = data.transpose(1, 2) if self.channels_first else data
        return kwargs


LENGTH_FUNCTION = "_get_feat_extract_output_lengths"


def output_lengths(model: nn.Module, lengths: torch.Tensor, function: str = LENGTH_FUNCTION) -> torch.Tensor:
    """Frames per sequence by the model's own formula (conv stack, adapter, subsampling)."""
    return getattr(model, function)(lengths).to(torch.int32)


@dataclass(frozen=True)
class FrameHead:
    """A frame-level output (CTC logits, hidden states) and its lengths when the input has lengths."""

    attr: str

    def __call__(self, model: nn.Module, kwargs: dict, lengths: Optional[torch.Tensor], function: str):
        out = getattr(model(**kwargs), self.attr)
        return out if lengths is None else (out, output_lengths(model, lengths, function))


@dataclass(frozen=True)
class UtteranceHead:
    """One vector per sequence (classification logits)."""

    attr: str = "logits"

    def __call__(self, model: nn.Module, kwargs: dict, lengths: Optional[torch.Tensor], function: str):
        return getattr(model(**kwargs), self.attr)


@dataclass(frozen=True)
class XVectorHead:
    """``(embeddings, logits)`` of a ``*ForXVector`` model.

    Its statistics pooling loops over the batch in Python and slices each
    sequence to its TDNN length: the batch size and the lengths would be
    frozen into the graph. While an export traces, the same statistics are
    computed with a mask (``_masked_statistics``); in eager, and so in the
    reference that verification compares against, the model's own forward runs.
    """

    def __call__(self, model: nn.Module, kwargs: dict, lengths: Optional[torch.Tensor], function: str):
        if not torch.onnx.is_in_onnx_export():
            out = model(**kwargs)
            return out.embeddings, out.logits
        stats = _xvector_statistics(model, kwargs)
        embeddings = model.feature_extractor(stats)
        return embeddings, model.classifier(embeddings)


def _xvector_statistics(model: nn.Module, kwargs: dict) -> torch.Tensor:
    """``[mean, std]`` over each sequence's TDNN frames, as ``*ForXVector.forward`` computes them."""
    weighted = model.config.use_weighted_layer_sum
    out = getattr(model, model.base_model_prefix)(**kwargs, output_hidden_states=weighted)
    if weighted:
        stacked = torch.stack(out.hidden_states, dim=1)
        norm = nn.functional.softmax(model.layer_weights, dim=-1)
        hidden = (stacked * norm.view(-1, 1, 1)).sum(dim=1)
    else:
        hidden = out.last_hidden_state
    hidden = model.projector(hidden)
    for layer in model.tdnn:
        hidden = layer(hidden)
    mask = kwargs.get("attention_mask")
    if mask is None:
        return torch.cat([hidden.mean(dim=1), hidden.std(dim=1)], dim=-1)
    frames = model._get_tdnn_output_lengths(model._get_feat_extract_output_lengths(mask.sum(dim=1)))
    # hidden[i, :n] keeps min(n, T) frames: the comparison below does the same
    keep = (torch.arange(hidden.shape[1], device=hidden.device)[None, :] < frames[:, None]).unsqueeze(-1)
    keep = keep.to(hidden.dtype)
    count = keep.sum(dim=1)
    mean = (hidden * keep).sum(dim=1) / count
    var = ((hidden - mean[:, None]) ** 2 * keep).sum(dim=1) / (count - 1)
    return torch.cat([mean, var.sqrt()], dim=-1)


@dataclass(frozen=True)
class UpsampleToInputLength:
    """SEW/SEW-D squeeze the frames (``pool``), upsample them back, and pad
    the result to the input's length under ``if upsampled < input``: both
    exporters bake that branch, so the model is a frame short at other
    parities. While an export traces, hooks pad the upsampled frames by
    ``squeeze - 1`` and cut them to the input's length, which is the same
    (zeros after the last upsampled frame) and leaves the branch nothing to do.
    In eager the hooks do nothing.
    """

    def install(self, model: nn.Module) -> int:
        found = 0
        for module in model.modules():
            if isinstance(getattr(module, "pool", None), nn.AvgPool1d) and hasattr(module, "upsample"):
                _pin_upsampled_length(module, int(module.pool.kernel_size[0]))
                found += 1
        return found


def _pin_upsampled_length(encoder: nn.Module, squeeze: int) -> None:
    seen = {}

    def remember(module, args, kwargs):
        seen["input"] = args[0] if args else kwargs["hidden_states"]

    def pin(module, args, out):
        if not torch.onnx.is_in_onnx_export():
            return out
        padded = nn.functional.pad(out, (0, 0, 0, squeeze - 1))
        return padded[:, :seen["input"].shape[1]]

    encoder.register_forward_pre_hook(remember, with_kwargs=True)
    encoder.upsample.register_forward_hook(pin)


class AudioModel(nn.Module):
    """``forward(data, [lengths])``: the wrapped model's task outputs, with output lengths where it has frames.

    ``length_function``: the model's method from input to output lengths.
    """

    def __init__(self, model: nn.Module, feeding: Feeding, head, length_function: str = LENGTH_FUNCTION):
        super().__init__()
        self.model, self.feeding, self.head, self.length_function = model, feeding, head, length_function

    def forward(self, data: torch.Tensor, *lengths: torch.Tensor):
        given = lengths[0] if lengths else None
        return self.head(self.model, self.feeding.kwargs(data, given), given, self.length_function)
