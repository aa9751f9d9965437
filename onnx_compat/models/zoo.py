"""The acceptance zoo: real third-party models at tiny sizes, plus the bundled ones.

Every entry is a factory returning ``{"model", "inputs", "outputs"}`` (the
CLI's job format), built from a config with random init, no download. Third-
party packages are imported inside the factories, so importing this module
needs neither ``transformers`` nor ``conformer``.

Transformers' encoders take an ``attention_mask``; ``MaskFromLengths`` gives
them the ``data``/``data:size1`` convention, the one adapter a user writes.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch
from torch import nn

from ..spec import Dim, TensorSpec
from . import blstm, conformer, conv_demo


class MaskFromLengths(nn.Module):
    """``forward(data, lengths)`` -> ``model(<key>=data, attention_mask=mask).last_hidden_state``."""

    def __init__(self, model: nn.Module, key: str, mask_axis: int = 1):
        super().__init__()
        self.model, self.key, self.mask_axis = model, key, mask_axis

    def forward(self, data, lengths):
        positions = torch.arange(data.shape[self.mask_axis], device=data.device)
        mask = (positions[None, :] < lengths[:, None]).long()
        return self.model(**{self.key: data}, attention_mask=mask).last_hidden_state


class LastHiddenState(nn.Module):
    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, data):
        return self.model(**{self.key: data}).last_hidden_state


def _features_job(model, features, out_dim, time_min=16, out_time="time_out"):
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time", min=time_min), features], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim(out_time), out_dim])]
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


_SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def lasr_encoder(seed: int = 0):
    """transformers LasrEncoder: Conformer with ``Conv1d(k=32, padding="same")`` (even kernel)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.LasrEncoderConfig(**_SPEECH, conv_kernel_size=32, num_mel_bins=20,
                                            subsampling_conv_channels=8)
    return _features_job(MaskFromLengths(transformers.LasrEncoder(config), "input_features"), 20, 32)


def seamless_m4t_speech_encoder(seed: int = 0):
    """transformers SeamlessM4TSpeechEncoder: Conformer, depthwise k=31 "same", relative-key SDPA."""
    import transformers
    from transformers.models.seamless_m4t.modeling_seamless_m4t import SeamlessM4TSpeechEncoder
    torch.manual_seed(seed)
    config = transformers.SeamlessM4TConfig(
        hidden_size=32, speech_encoder_layers=2, speech_encoder_attention_heads=4,
        speech_encoder_intermediate_size=64, feature_projection_input_dim=20, conv_depthwise_kernel_size=31,
        adaptor_kernel_size=4, adaptor_stride=2, num_adapter_layers=1, add_adapter=True)
    return _features_job(MaskFromLengths(SeamlessM4TSpeechEncoder(config), "input_features"), 20, 32)


def wav2vec2_conformer(seed: int = 0):
    """transformers Wav2Vec2ConformerModel (relative positions) over raw audio ``[B, samples]``."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.Wav2Vec2ConformerConfig(
        **_SPEECH, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, conv_depthwise_kernel_size=7, position_embeddings_type="relative")
    batch = Dim("batch")
    samples = Dim("samples", min=200, multiple=10)  # conv strides 5 x 2
    inputs = [TensorSpec("data", [batch, samples], lengths=[1])]
    outputs = [TensorSpec("output", [batch, Dim("frames"), 32])]
    model = MaskFromLengths(transformers.Wav2Vec2ConformerModel(config), "input_values")
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


def parakeet_encoder(seed: int = 0):
    """transformers ParakeetEncoder (FastConformer, relative positions, SDPA)."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.ParakeetEncoderConfig(**_SPEECH, num_mel_bins=20, conv_kernel_size=9,
                                                subsampling_conv_channels=8, subsampling_factor=4)
    return _features_job(MaskFromLengths(transformers.ParakeetEncoder(config), "input_features"), 20, 32)


def whisper_encoder(seed: int = 0):
    """transformers WhisperEncoder: the input length is fixed by design (2 x max_source_positions)."""
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    torch.manual_seed(seed)
    config = transformers.WhisperConfig(num_mel_bins=20, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                        encoder_ffn_dim=64, max_source_positions=30)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, 20, 60])]
    outputs = [TensorSpec("output", [batch, 30, 32])]
    return {"model": LastHiddenState(WhisperEncoder(config), "input_features").eval(), "inputs": inputs,
            "outputs": outputs}


def fastspeech2_conformer_hifigan(seed: int = 0):
    """transformers FastSpeech2ConformerHifiGan: spectrogram ``[B, T, mel]`` -> waveform ``[B, 4T]``."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.FastSpeech2ConformerHifiGanConfig(
        model_in_dim=20, upsample_initial_channel=32, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4),
        resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=[[1, 3], [1, 3]], initializer_range=0.2)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("frames", min=8), 20])]
    outputs = [TensorSpec("output", [batch, Dim("samples")])]
    return {"model": transformers.FastSpeech2ConformerHifiGan(config).eval(), "inputs": inputs, "outputs": outputs}


def lucidrains_conformer(seed: int = 0):
    """lucidrains ``conformer.Conformer``: explicit F.pad, its own attention (the control)."""
    import conformer as lucidrains
    torch.manual_seed(seed)
    model = lucidrains.Conformer(dim=32, depth=2, dim_head=8, heads=4, conv_kernel_size=7)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time"), 32])]
    outputs = [TensorSpec("output", [batch, Dim("time"), 32])]
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


def bundled_conformer(seed: int = 0):
    return conformer.tiny(seed=seed)


def bundled_conv_demo(seed: int = 0):
    return conv_demo.build(seed=seed)


def bundled_blstm(seed: int = 0):
    return blstm.build(hidden=32, seed=seed)


ZOO: Dict[str, Callable[..., dict]] = {
    "transformers LasrEncoder": lasr_encoder,
    "transformers SeamlessM4TSpeechEncoder": seamless_m4t_speech_encoder,
    "transformers Wav2Vec2ConformerModel": wav2vec2_conformer,
    "transformers ParakeetEncoder": parakeet_encoder,
    "transformers WhisperEncoder": whisper_encoder,
    "transformers FastSpeech2ConformerHifiGan": fastspeech2_conformer_hifigan,
    "lucidrains conformer.Conformer": lucidrains_conformer,
    "onnx_compat Conformer (tiny)": bundled_conformer,
    "onnx_compat conv demo": bundled_conv_demo,
    "onnx_compat BLSTM": bundled_blstm,
}
