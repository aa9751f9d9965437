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

from onnx_compat.spec import Dim, TensorSpec
from onnx_compat.models import audio, blstm, conformer, conv_demo


class MaskFromLengths(nn.Module):
    """``forward(data, lengths)`` -> ``model(<key>=data, attention_mask=mask).last_hidden_state``."""

    def __init__(self, model: nn.Module, key: str, mask_axis: int = 1):
        super().__init__()
        self.model, self.key, self.mask_axis = model, key, mask_axis

    def forward(self, data, lengths):
        positions = torch.arange(data.shape[self.mask_axis], device=data.device)
        mask = (positions[None, :] < lengths[:, None]).long()
        return self.model(**{self.key: data}, attention_mask=mask).last_hidden_state


class Logits(nn.Module):
    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, data):
        return self.model(**{self.key: data}).logits


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


def _spread_init(model: nn.Module, seed: int) -> nn.Module:
    """Weights of unit scale and BatchNorm statistics of 1: random-init MobileNets otherwise output ~0."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, (2.0 / p[0].numel()) ** 0.5)
            else:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.normal_(0.0, 0.1)
    return model


def mobilenet_v2_tf_padding(seed: int = 0):
    """transformers MobileNetV2ForImageClassification with ``tf_padding=True`` (TF 'SAME' pads from int(shape))."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.MobileNetV2Config(image_size=64, depth_multiplier=0.25, min_depth=4, tf_padding=True,
                                            num_labels=5)
    model = _spread_init(Logits(transformers.MobileNetV2ForImageClassification(config), "pixel_values"), seed)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, 3, Dim("height", min=32, example=64), Dim("width", min=32, example=72)])]
    return {"model": model.eval(), "inputs": inputs, "outputs": [TensorSpec("output", [batch, 5])]}


class MimiCodes(nn.Module):
    """Mimi's encoder half: raw audio ``[B, samples]`` -> codes ``[B, quantizers, frames]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, data):
        return self.model.encode(data[:, None]).audio_codes


def mimi_encode(seed: int = 0):
    """transformers MimiModel.encode: SEANet convs with tensor-valued geometry, a transformer, RVQ."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.MimiConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
        intermediate_size=64, num_filters=4, upsampling_ratios=[4, 2], codebook_size=16, codebook_dim=16,
        num_quantizers=2, num_semantic_quantizers=1, sliding_window=20, sampling_rate=800, frame_rate=50,
        upsample_groups=32, vector_quantization_hidden_dimension=16)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("samples", min=200, example=800)])]
    outputs = [TensorSpec("output", [batch, 2, Dim("frames")], dtype=torch.int64)]
    model = MimiCodes(transformers.MimiModel(config))
    with torch.no_grad():  # codebooks start at zero (every frame gets code 0): spread them
        for name, buffer in model.named_buffers():
            if name.endswith("embed_sum"):
                buffer.normal_()
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


class Pooled(nn.Module):
    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, data):
        return self.model(**{self.key: data}).pooler_output


def clap_audio(seed: int = 0):
    """transformers ClapAudioModel (Swin over a fixed-size mel image); its forward assigns window_size."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.ClapAudioConfig(
        window_size=4, num_mel_bins=16, spec_size=32, patch_size=4, patch_stride=(4, 4), hidden_size=32,
        depths=[1, 1], num_attention_heads=[2, 2], projection_dim=16, enable_fusion=False,
        patch_embeds_hidden_size=16)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, 1, 32, 16])]
    outputs = [TensorSpec("output", [batch, 32])]
    return {"model": Pooled(transformers.ClapAudioModel(config), "input_features").eval(), "inputs": inputs,
            "outputs": outputs}


def qwen25_omni_ecapa(seed: int = 0):
    """transformers' ECAPA_TimeDelayNet (Qwen2.5-Omni speaker encoder): reflect "same" convs with dilation,
    attentive statistics pooling whose mask comes from ``len(torch.ones(B))``."""
    import transformers
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet
    torch.manual_seed(seed)
    config = transformers.Qwen2_5OmniDiTConfig(
        mel_dim=20, enc_dim=16, enc_channels=[16, 16, 16, 32], enc_kernel_sizes=[5, 3, 3, 1],
        enc_dilations=[1, 2, 3, 1], enc_attention_channels=8, enc_res2net_scale=2, enc_se_channels=8)
    batch = Dim("batch")
    inputs = [TensorSpec("data", [batch, Dim("time", min=8), 20])]
    outputs = [TensorSpec("output", [batch, 16])]
    return {"model": ECAPA_TimeDelayNet(config).eval(), "inputs": inputs, "outputs": outputs}


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


def bundled_log_mel(seed: int = 0):
    return audio.frontend(seed=seed)


def bundled_raw_audio_conformer(seed: int = 0):
    return audio.raw_conformer(seed=seed)


def bundled_istft_vocoder(seed: int = 0):
    return audio.vocoder(seed=seed)


ZOO: Dict[str, Callable[..., dict]] = {
    "transformers LasrEncoder": lasr_encoder,
    "transformers SeamlessM4TSpeechEncoder": seamless_m4t_speech_encoder,
    "transformers Wav2Vec2ConformerModel": wav2vec2_conformer,
    "transformers ParakeetEncoder": parakeet_encoder,
    "transformers WhisperEncoder": whisper_encoder,
    "transformers FastSpeech2ConformerHifiGan": fastspeech2_conformer_hifigan,
    "transformers MobileNetV2 (tf_padding)": mobilenet_v2_tf_padding,
    "transformers Mimi (encode)": mimi_encode,
    "transformers ClapAudioModel": clap_audio,
    "transformers Qwen2.5-Omni ECAPA_TimeDelayNet": qwen25_omni_ecapa,
    "lucidrains conformer.Conformer": lucidrains_conformer,
    "onnx_compat Conformer (tiny)": bundled_conformer,
    "onnx_compat conv demo": bundled_conv_demo,
    "onnx_compat BLSTM": bundled_blstm,
    "onnx_compat log-mel front-end": bundled_log_mel,
    "onnx_compat raw-audio Conformer": bundled_raw_audio_conformer,
    "onnx_compat ISTFT vocoder": bundled_istft_vocoder,
}
