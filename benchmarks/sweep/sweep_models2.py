"""The sweep's second round (issue #39): models from libraries that neither round one nor the tests use.

Same rules as ``sweep_models.py``: a tiny config of each library's main models, random init (or the
weights the package itself ships), no download at run time; wrappers only adapt I/O (lengths in, a
tuple or dict out). Registered with ``round=2`` so ``sweep.py --round 2`` runs and writes them apart
from round one.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out, wave


def _r2(library: str, kind: str):
    return entry(library, kind, round=2)


def tokens(vocab, example=13, min=4):
    """Token ids ``[B, T]`` with their lengths (TTS and punctuation front ends)."""
    time = Dim("tokens", min=min, example=example)
    return [TensorSpec("data", [B, time], dtype=torch.int64, lengths=[1], values=(1, vocab))]


def _as_trained(model: nn.Module, scale: float = 0.01) -> nn.Module:
    """What a checkpoint's vector quantisers hold: codebooks marked initialised and filled. A fresh one is zeros
    and flagged uninitialised, so its first forward would run k-means on that batch (and rewrite itself). The
    scale keeps codes near the encoder's latents (at randn scale every frame picks the same code)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            for flag in ("inited", "_initialized"):
                if isinstance(m._buffers.get(flag), torch.Tensor):
                    m._buffers[flag].fill_(1)
            book = next((m._buffers[n] for n in ("embed", "embedding_sum") if m._buffers.get(n) is not None), None)
            if book is not None:
                book.copy_(torch.randn(book.shape, generator=g) * scale)
                if m._buffers.get("embed_avg") is not None:
                    m._buffers["embed_avg"].copy_(book)
    return model


# ---------------------------------------------------------------- espnet: ASR encoders, TTS, enhancement

def _espnet_encoder(cls_path: str, **kw):
    _manual()
    module, _, name = cls_path.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    model = cls(input_size=20, output_size=32, attention_heads=4, num_blocks=2, dropout_rate=0.0,
                positional_dropout_rate=0.0, attention_dropout_rate=0.0, input_layer="conv2d", **kw)
    return _job(Seeded(model, lambda m, x, n: m(x, n)[:2]), feats(20, lengths=True, min=16),
                out("frames", 32, lengths=[1]))


@_r2("espnet", "asr-encoder")
def espnet_conformer():
    return _espnet_encoder("espnet2.asr.encoder.conformer_encoder.ConformerEncoder", linear_units=64,
                           cnn_module_kernel=7, macaron_style=True, use_cnn_module=True,
                           pos_enc_layer_type="rel_pos", selfattention_layer_type="rel_selfattn")


@_r2("espnet", "asr-encoder")
def espnet_ebranchformer():
    return _espnet_encoder("espnet2.asr.encoder.e_branchformer_encoder.EBranchformerEncoder", linear_units=64,
                           cgmlp_linear_units=64, cgmlp_conv_kernel=7)


@_r2("espnet", "asr-encoder")
def espnet_transformer():
    return _espnet_encoder("espnet2.asr.encoder.transformer_encoder.TransformerEncoder", linear_units=64)


@_r2("espnet", "asr-encoder")
def espnet_branchformer():
    _manual()
    from espnet2.asr.encoder.branchformer_encoder import BranchformerEncoder
    model = BranchformerEncoder(input_size=20, output_size=32, attention_heads=4, num_blocks=2,
                                cgmlp_linear_units=64, cgmlp_conv_kernel=7, dropout_rate=0.0,
                                positional_dropout_rate=0.0, attention_dropout_rate=0.0, input_layer="conv2d")
    return _job(Seeded(model, lambda m, x, n: m(x, n)[:2]), feats(20, lengths=True, min=16),
                out("frames", 32, lengths=[1]))


@_r2("espnet", "tts")
def espnet_fastspeech2():
    """Text to mel: the duration predictor's output drives a length regulator (frames depend on values)."""
    _manual()
    from espnet2.tts.fastspeech2.fastspeech2 import FastSpeech2
    model = FastSpeech2(idim=20, odim=20, adim=32, aheads=2, elayers=1, eunits=32, dlayers=1, dunits=32,
                        postnet_layers=2, postnet_chans=16, duration_predictor_layers=1,
                        duration_predictor_chans=16, energy_predictor_layers=1, energy_predictor_chans=16,
                        pitch_predictor_layers=1, pitch_predictor_chans=16, reduction_factor=1)
    return _job(Seeded(model, lambda m, x, n: m._forward(x, n, is_inference=True)[1]), tokens(20),
                out("frames", 20))


@_r2("espnet", "enhancement")
def espnet_tfgridnet():
    """TF-GridNet (v2), ESPnet's enhancement/separation model: its own STFT, grid blocks, its own iSTFT."""
    _manual()
    from espnet2.enh.separator.tfgridnetv2_separator import TFGridNetV2
    model = TFGridNetV2(input_dim=None, n_srcs=1, n_fft=64, stride=16, n_layers=1, lstm_hidden_units=8,
                        attn_n_head=2, attn_approx_qk_dim=16, emb_dim=8, emb_ks=2, emb_hs=1)
    return _job(Seeded(model, lambda m, x, n: m(x, n)[0][0]), wave(lengths=True, min=800),
                out("time"))


# ---------------------------------------------------------------- coqui-tts: vocoders and speaker encoders

@_r2("coqui-tts", "vocoder")
def coqui_hifigan():
    _manual()
    from TTS.vocoder.models.hifigan_generator import HifiganGenerator
    model = HifiganGenerator(in_channels=20, out_channels=1, resblock_type="1",
                             resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], resblock_kernel_sizes=[3, 7],
                             upsample_kernel_sizes=[8, 8], upsample_initial_channel=16, upsample_factors=[4, 4])
    return _job(Seeded(model, lambda m, x: m.inference(x)), feats(20, channels_first=True), out(1, "time_out"))


@_r2("coqui-tts", "vocoder")
def coqui_univnet():
    _manual()
    from TTS.vocoder.models.univnet_generator import UnivnetGenerator
    model = UnivnetGenerator(in_channels=16, out_channels=1, hidden_channels=8, cond_channels=20,
                             upsample_factors=[4, 4], lvc_layers_each_block=2, lvc_kernel_size=3,
                             kpnet_hidden_channels=16, kpnet_conv_size=3, dropout=0.0)
    return _job(Seeded(model, lambda m, c: m.inference(c)), feats(20, channels_first=True), out(1, "time_out"))


@_r2("coqui-tts", "vocoder")
def coqui_multiband_melgan():
    _manual()
    from TTS.vocoder.models.multiband_melgan_generator import MultibandMelganGenerator
    model = MultibandMelganGenerator(in_channels=20, out_channels=4, proj_kernel=7, base_channels=32,
                                     upsample_factors=(2, 4), res_kernel=3, num_res_blocks=2)
    return _job(Seeded(model, lambda m, c: m.inference(c)), feats(20, channels_first=True), out(1, "time_out"))


@_r2("coqui-tts", "speaker")
def coqui_resnet_speaker():
    _manual()
    from TTS.encoder.models.resnet import ResNetSpeakerEncoder
    model = ResNetSpeakerEncoder(input_dim=64, proj_dim=16, layers=[1, 1, 1, 1], num_filters=[8, 8, 16, 16])
    return _job(Seeded(model, lambda m, x: m(x, l2_norm=True)), feats(64, channels_first=True), out(16))


@_r2("coqui-tts", "speaker")
def coqui_lstm_speaker():
    _manual()
    from TTS.encoder.models.lstm import LSTMSpeakerEncoder
    model = LSTMSpeakerEncoder(input_dim=20, proj_dim=16, lstm_dim=32, num_lstm_layers=2)
    return _job(Seeded(model, lambda m, x: m(x, l2_norm=True)), feats(20, channels_first=True), out(16))


# ---------------------------------------------------------------- funasr: VAD, Paraformer/SenseVoice encoders, speaker, punctuation

@_r2("funasr", "vad")
def funasr_fsmn_vad():
    _manual()
    from funasr.models.fsmn_vad_streaming.encoder import FSMN
    model = FSMN(input_dim=40, input_affine_dim=32, fsmn_layers=2, linear_dim=32, proj_dim=16, lorder=5, rorder=0,
                 lstride=1, rstride=0, output_affine_dim=32, output_dim=8)
    return _job(Seeded(model, lambda m, x: m(x, {})), feats(40), out("time", 8))


@_r2("funasr", "asr-encoder")
def funasr_paraformer_encoder():
    _manual()
    from funasr.models.sanm.encoder import SANMEncoder
    model = SANMEncoder(input_size=40, output_size=32, attention_heads=4, linear_units=64, num_blocks=2,
                        dropout_rate=0.0, positional_dropout_rate=0.0, attention_dropout_rate=0.0, input_layer="pe",
                        kernel_size=5, sanm_shfit=0)
    return _job(Seeded(model, lambda m, x, n: m(x, n)[:2]), feats(40, lengths=True), out("time", 32, lengths=[1]))


@_r2("funasr", "asr-encoder")
def funasr_sensevoice_encoder():
    _manual()
    from funasr.models.sense_voice.model import SenseVoiceEncoderSmall
    model = SenseVoiceEncoderSmall(input_size=40, output_size=32, attention_heads=4, linear_units=64, num_blocks=2,
                                   tp_blocks=1, dropout_rate=0.0, positional_dropout_rate=0.0,
                                   attention_dropout_rate=0.0, kernel_size=5, sanm_shfit=0)
    return _job(Seeded(model, lambda m, x, n: m(x, n)[:2]), feats(40, lengths=True), out("time", 32, lengths=[1]))


@_r2("funasr", "speaker")
def funasr_campplus():
    _manual()
    from funasr.models.campplus.model import CAMPPlus
    model = CAMPPlus(feat_dim=40, embedding_size=16, growth_rate=8, bn_size=2, init_channels=16,
                     memory_efficient=False)
    return _job(model, feats(40, min=16), out(16))


@_r2("funasr", "punctuation")
def funasr_ct_punc():
    _manual()
    from funasr.models.ct_transformer.model import CTTransformer
    model = CTTransformer(encoder="SANMEncoder", encoder_conf=dict(input_size=16, output_size=16, attention_heads=2,
                                                                    linear_units=32, num_blocks=1,
                                                                    dropout_rate=0.0, positional_dropout_rate=0.0,
                                                                    attention_dropout_rate=0.0, input_layer="pe",
                                                                    kernel_size=5, sanm_shfit=0),
                          vocab_size=30, punc_list=["_", ",", ".", "?"], embed_unit=16, att_unit=16)
    return _job(Seeded(model, lambda m, x, n: m.punc_forward(x, n)[0]), tokens(30), out("tokens", 4))


# ---------------------------------------------------------------- panns-inference: audio tagging, sound events

def _panns(cls):
    _manual()
    import panns_inference.models as pm
    model = getattr(pm, cls)(sample_rate=8000, window_size=256, hop_size=80, mel_bins=64, fmin=50, fmax=4000,
                             classes_num=10)
    return model


@_r2("panns-inference", "tagging")
def panns_cnn14():
    model = _panns("Cnn14")
    return _job(Seeded(model, lambda m, x: m(x)["clipwise_output"]), wave(example=8000, min=3200), out(10))


@_r2("panns-inference", "sound-events")
def panns_cnn14_decision_level():
    model = _panns("Cnn14_DecisionLevelMax")
    return _job(Seeded(model, lambda m, x: m(x)["framewise_output"]), wave(example=8000, min=3200),
                out("frames", 10))


# ---------------------------------------------------------------- shipped weights: silero-vad, resemblyzer, pesto, torchfcpe

@_r2("silero-vad", "vad")
def silero_vad():
    """The package's TorchScript model, exported as it ships (a ScriptModule, no wrapper): its 16 kHz network
    takes one 512-sample chunk (+64 samples of context) and the LSTM state, and returns the speech
    probability and the new state (the outer module keeps that state in Python attributes)."""
    from silero_vad import load_silero_vad
    model = load_silero_vad()._model
    inputs = [TensorSpec("data", [B, 576]), TensorSpec("state", [2, B, 128])]
    return _job(model, inputs, [TensorSpec("prob", [B, 1]), TensorSpec("state_out", [2, B, 128])])


@_r2("resemblyzer", "speaker")
def resemblyzer_voice_encoder():
    from resemblyzer import VoiceEncoder
    model = VoiceEncoder(device="cpu", verbose=False)
    return _job(model, feats(40, example=160, min=40), out(256))


@_r2("pesto-pitch", "pitch")
def pesto():
    from pesto import load_model
    model = load_model("mir-1k_g7", step_size=10.0, sampling_rate=16000)
    return _job(Seeded(model, lambda m, x: m(x, convert_to_freq=True, return_activations=False)[0]),
                wave(example=8000, min=2000), out("frames"))


@_r2("torchfcpe", "pitch")
def torchfcpe():
    from torchfcpe import spawn_bundled_infer_model
    model = spawn_bundled_infer_model(device="cpu")
    return _job(Seeded(model, lambda m, x: m(x[..., None], sr=16000)[..., 0]), wave(example=8000, min=2000),
                out("frames"))


# ---------------------------------------------------------------- diffsptk: differentiable SPTK

@_r2("diffsptk", "spectrogram")
def diffsptk_mfcc():
    import diffsptk

    class Mfcc(nn.Module):
        def __init__(self):
            super().__init__()
            self.stft = diffsptk.STFT(frame_length=256, frame_period=80, fft_length=256)
            self.mfcc = diffsptk.MFCC(fft_length=256, mfcc_order=12, n_channel=24, sample_rate=8000)

        def forward(self, x):
            return self.mfcc(self.stft(x))
    return _job(Mfcc(), wave(), out("frames", 12))


@_r2("diffsptk", "vocoder-features")
def diffsptk_mel_cepstrum():
    import diffsptk

    class Mcep(nn.Module):
        def __init__(self):
            super().__init__()
            self.stft = diffsptk.STFT(frame_length=256, frame_period=80, fft_length=256)
            self.mcep = diffsptk.MelCepstralAnalysis(fft_length=256, cep_order=12, alpha=0.42, n_iter=2)

        def forward(self, x):
            return self.mcep(self.stft(x))
    return _job(Mcep(), wave(), out("frames", 13))


@_r2("diffsptk", "vocoder-features")
def diffsptk_lpc():
    import diffsptk

    class Lpc(nn.Module):
        def __init__(self):
            super().__init__()
            self.frame = diffsptk.Frame(frame_length=256, frame_period=80)
            self.window = diffsptk.Window(in_length=256)
            self.lpc = diffsptk.LPC(frame_length=256, lpc_order=12)

        def forward(self, x):
            return self.lpc(self.window(self.frame(x)))
    return _job(Lpc(), wave(), out("frames", 13))


@_r2("diffsptk", "pitch")
def diffsptk_pitch_crepe():
    import diffsptk
    model = diffsptk.Pitch(frame_period=160, sample_rate=16000, algorithm="crepe", out_format="f0", model="tiny")
    # torchcrepe keeps its network in a module global (torchcrepe.infer.model), loaded on the first call;
    # preload it (its documented torchcrepe.load.model), fresh for each build: an earlier step's trace left it
    import torchcrepe
    torchcrepe.load.model("cpu", "tiny")
    return _job(model, wave(example=8000, min=2000), out("frames"))


# ---------------------------------------------------------------- lhotse: Kaldi-compatible features in torch

@_r2("lhotse", "spectrogram")
def lhotse_fbank():
    from lhotse.features.kaldi.layers import Wav2LogFilterBank
    return _job(Wav2LogFilterBank(sampling_rate=16000, num_filters=40), wave(example=8000, min=800), out("frames", 40))


@_r2("lhotse", "spectrogram")
def lhotse_mfcc():
    from lhotse.features.kaldi.layers import Wav2MFCC
    return _job(Wav2MFCC(sampling_rate=16000, num_ceps=13), wave(example=8000, min=800), out("frames", 13))


# ---------------------------------------------------------------- codecs and watermarking: speechtokenizer, audioseal, moshi (Mimi)

@_r2("speechtokenizer", "codec")
def speechtokenizer():
    _manual()
    from speechtokenizer import SpeechTokenizer
    config = dict(n_filters=8, dimension=32, strides=[4, 4], lstm_layers=1, bidirectional=True, dilation_base=2,
                  residual_kernel_size=3, n_residual_layers=1, activation="ELU", sample_rate=16000, n_q=2,
                  semantic_dimension=32, codebook_size=64)
    model = _as_trained(SpeechTokenizer(config))
    return _job(Seeded(model, lambda m, x: m(x)[0]), wave(channels=1, example=1600, min=320, multiple=16),
                out(1, "time"))


def _audioseal_seanet():
    return dict(activation="ELU", activation_params={"alpha": 1.0}, causal=False, channels=1, compress=2,
                dilation_base=2, dimension=32, disable_norm_outer_blocks=0, kernel_size=7, last_kernel_size=7,
                lstm=1, n_filters=8, n_residual_layers=1, norm="none", norm_params={}, pad_mode="constant",
                ratios=[4, 4], residual_kernel_size=3, true_skip=True)


@_r2("audioseal", "watermark")
def audioseal_generator():
    _manual()
    from audioseal.builder import AudioSealWMConfig, DecoderConfig, SEANetConfig, create_generator
    config = AudioSealWMConfig(nbits=16, seanet=SEANetConfig(**_audioseal_seanet()),
                               decoder=DecoderConfig(final_activation=None, final_activation_params=None,
                                                     trim_right_ratio=1.0))
    model = create_generator(config)
    # the 16 message bits are an input: without one, get_watermark draws a random message on every call

    class Watermark(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, data, message):
            return self.model.get_watermark(data, sample_rate=16000, message=message)
    inputs = wave(channels=1, example=1600, min=320, multiple=16) + [
        TensorSpec("message", [B, 16], dtype=torch.int64, values=(0, 2))]
    return _job(Watermark(), inputs, out(1, "time"))


@_r2("audioseal", "watermark")
def audioseal_detector():
    _manual()
    from audioseal.builder import AudioSealDetectorConfig, SEANetConfig, create_detector
    model = create_detector(AudioSealDetectorConfig(nbits=16, seanet=SEANetConfig(**_audioseal_seanet())))
    return _job(Seeded(model, lambda m, x: m(x, sample_rate=16000)[0]),
                wave(channels=1, example=1600, min=320, multiple=16), out(2, "time"))


@_r2("moshi", "codec")
def moshi_mimi_encoder():
    """Mimi (Moshi's codec): SEANet, a causal RoPE transformer, split RVQ; a small config of the same build."""
    _manual()
    from moshi.models import loaders
    seanet = dict(loaders._seanet_kwargs, dimension=32, n_filters=8, ratios=[4, 4])
    transformer = dict(loaders._transformer_kwargs, d_model=32, num_heads=2, num_layers=1, dim_feedforward=64,
                       context=50, input_dimension=32, output_dimensions=[32])
    quantizer = dict(loaders._quantizer_kwargs, dimension=16, n_q=2, bins=64, input_dimension=32,
                     output_dimension=32)
    config = dict(loaders._mimi_config, sample_rate=800, frame_rate=25.0, seanet=seanet, transformer=transformer,
                  quantizer=quantizer)
    model = _as_trained(loaders.get_mimi(None, config, num_codebooks=2))
    return _job(Seeded(model, lambda m, x: m.encode(x)), wave(channels=1, example=1600, min=320, multiple=32),
                [TensorSpec("output", [B, 2, Dim("frames")], dtype=torch.int64)])
