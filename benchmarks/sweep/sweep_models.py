"""The sweep's models: third-party PyTorch audio/speech libraries the zoo does not use.

Each entry names its PyPI package, a kind, and a builder returning the job
``{"model", "inputs", "outputs"}`` (tiny config, random init, no download).
Libraries are imported inside the builders, so this module imports with torch
alone. Wrappers only adapt the I/O to the specs (lengths to a mask, a dict to a
tensor); the library's own forward is what is exported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec


@dataclass(frozen=True)
class Entry:
    name: str
    library: str  # the PyPI package
    kind: str
    build: Callable[[], dict]
    round: int = 1  # the sweep round that added it (round 2: sweep_models2.py)


ENTRIES: Dict[str, Entry] = {}


def entry(library: str, kind: str, name: str = "", round: int = 1):
    def register(fn):
        key = name or fn.__name__
        ENTRIES[key] = Entry(key, library, kind, fn, round)
        return fn
    return register


B = Dim("batch")


def _job(model, inputs, outputs) -> dict:
    torch.manual_seed(0)
    return {"model": model.eval(), "inputs": inputs, "outputs": outputs}


def wave(example=4000, min=400, channels=None, multiple=1, lengths=False):
    """Raw audio ``[B, T]`` (or ``[B, C, T]``)."""
    time = Dim("time", min=min, example=example, multiple=multiple)
    dims = [B, time] if channels is None else [B, channels, time]
    return [TensorSpec("data", dims, lengths=[len(dims) - 1] if lengths else [])]


def feats(features, example=37, min=8, lengths=False, channels_first=False, multiple=1):
    """Features ``[B, T, F]`` (``[B, F, T]`` when channels first)."""
    time = Dim("time", min=min, example=example, multiple=multiple)
    dims = [B, features, time] if channels_first else [B, time, features]
    return [TensorSpec("data", dims, lengths=[dims.index(time)] if lengths else [])]


def out(*dims, lengths=()):
    return [TensorSpec("output", [B] + [Dim(d) if isinstance(d, str) else d for d in dims], lengths=lengths)]


class Seeded(nn.Module):
    """Calls ``fn(model, data[, lengths])``: the adapter a user writes around a library's forward.
    Named arguments, not ``*args``: torch.export matches ``dynamic_shapes`` to the signature."""

    def __init__(self, model: nn.Module, fn: Callable):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, data, lengths=None):
        return self.fn(self.model, data) if lengths is None else self.fn(self.model, data, lengths)


def _mask(data, lengths, axis=1):
    return torch.arange(data.shape[axis], device=data.device)[None, :] < lengths[:, None]


def _manual(seed=0):
    torch.manual_seed(seed)


# ---------------------------------------------------------------- asteroid: source separation

def _asteroid(cls, **kw):
    _manual()
    import asteroid.models as am
    model = getattr(am, cls)(**kw)
    return _job(model, wave(), out(None, "time_out"))


@entry("asteroid", "separation")
def asteroid_convtasnet():
    return _asteroid("ConvTasNet", n_src=2, n_blocks=2, n_repeats=1, bn_chan=16, hid_chan=32, skip_chan=16,
                     n_filters=32, kernel_size=16, stride=8)


@entry("asteroid", "separation")
def asteroid_dprnn():
    return _asteroid("DPRNNTasNet", n_src=2, n_filters=32, bn_chan=16, hid_size=16, chunk_size=20, n_repeats=1)


@entry("asteroid", "separation")
def asteroid_dptnet():
    return _asteroid("DPTNet", n_src=2, n_heads=2, ff_hid=16, chunk_size=20, n_repeats=1, n_filters=32)


@entry("asteroid", "separation")
def asteroid_lstmtasnet():
    return _asteroid("LSTMTasNet", n_src=2, n_layers=1, hid_size=16, n_filters=32, dropout=0.0)


@entry("asteroid", "separation")
def asteroid_sudormrf():
    return _asteroid("SuDORMRFNet", n_src=2, bn_chan=16, num_blocks=2, upsampling_depth=2, n_filters=32)


@entry("asteroid", "separation")
def asteroid_sudormrf_improved():
    return _asteroid("SuDORMRFImprovedNet", n_src=2, bn_chan=16, num_blocks=2, upsampling_depth=2, n_filters=32)


# DCCRNet is left out: it does not build with numpy 2 (an LSTM input_size computed as numpy.int64).


@entry("asteroid", "enhancement")
def asteroid_dcunet():
    _manual()
    import asteroid.models as am
    model = am.DCUNet("DCUNet-10", stft_n_filters=128, stft_kernel_size=64, stft_stride=16, fix_length_mode="pad")
    return _job(model, wave(), out(None, "time_out"))


@entry("asteroid", "enhancement")
def asteroid_demask():
    _manual()
    import asteroid.models as am
    model = am.DeMask(hidden_dims=(32,), n_filters=64, stride=16, kernel_size=64)
    return _job(model, wave(), out(None, "time_out"))


# ---------------------------------------------------------------- asteroid-filterbanks: spectrogram layers

def _filterbank(fb, decode=False):
    _manual()
    from asteroid_filterbanks import Decoder, Encoder
    if decode:
        return _job(Decoder(fb), feats(fb.n_feats_out, channels_first=True), out(1, "time_out"))
    return _job(Encoder(fb), wave(), out(fb.n_feats_out, "frames"))


@entry("asteroid-filterbanks", "spectrogram")
def filterbanks_stft_encoder():
    from asteroid_filterbanks import STFTFB
    return _filterbank(STFTFB(n_filters=64, kernel_size=64, stride=16))


@entry("asteroid-filterbanks", "spectrogram")
def filterbanks_paramsinc_encoder():
    from asteroid_filterbanks import ParamSincFB
    return _filterbank(ParamSincFB(n_filters=32, kernel_size=65, stride=16))


@entry("asteroid-filterbanks", "spectrogram")
def filterbanks_stft_decoder():
    from asteroid_filterbanks import STFTFB
    return _filterbank(STFTFB(n_filters=64, kernel_size=64, stride=16), decode=True)


@entry("asteroid-filterbanks", "spectrogram")
def filterbanks_torchstft_encoder():
    from asteroid_filterbanks import TorchSTFTFB
    return _filterbank(TorchSTFTFB(n_filters=64, kernel_size=64, stride=16))


# ---------------------------------------------------------------- julius: resampling and filters

@entry("julius", "resampling")
def julius_resample_frac():
    from julius import ResampleFrac
    return _job(ResampleFrac(16000, 22050), wave(), out("time_out"))


@entry("julius", "resampling")
def julius_lowpass():
    from julius import LowPassFilter
    return _job(LowPassFilter(0.1), wave(), out("time"))


@entry("julius", "filter")
def julius_lowpass_fft():
    from julius import LowPassFilter
    return _job(LowPassFilter(0.02, fft=True), wave(), out("time"))


@entry("julius", "filter")
def julius_split_bands():
    from julius import SplitBands
    return _job(SplitBands(16000, n_bands=4), wave(), [TensorSpec("output", [4, B, Dim("time")])])


# ---------------------------------------------------------------- encodec

def _seanet(kind):
    _manual()
    from encodec.modules import SEANetDecoder, SEANetEncoder
    kw = dict(channels=1, dimension=16, n_filters=4, ratios=[4, 2], lstm=1)
    return SEANetEncoder(**kw) if kind == "enc" else SEANetDecoder(**kw)


@entry("encodec", "codec")
def encodec_seanet_encoder():
    return _job(_seanet("enc"), wave(channels=1), out(16, "frames"))


@entry("encodec", "codec")
def encodec_seanet_decoder():
    return _job(_seanet("dec"), feats(16, channels_first=True), out(1, "time_out"))


@entry("encodec", "codec")
def encodec_model():
    _manual()
    from encodec import EncodecModel
    from encodec.quantization import ResidualVectorQuantizer
    quantizer = ResidualVectorQuantizer(dimension=16, n_q=4, bins=32)
    model = EncodecModel(_seanet("enc"), _seanet("dec"), quantizer, target_bandwidths=[1.5], sample_rate=8000,
                         channels=1)
    # 1200 samples (150 LSTM frames): the encoder's 500 frames make each dynamo export run past 4 minutes
    return _job(model, wave(channels=1, example=1200), out(1, "time_out"))


# ---------------------------------------------------------------- descript-audio-codec

def _dac():
    _manual()
    import dac
    return dac.DAC(encoder_dim=8, encoder_rates=[2, 4], latent_dim=16, decoder_dim=32, decoder_rates=[4, 2],
                   n_codebooks=2, codebook_size=32, codebook_dim=4, sample_rate=8000)


@entry("descript-audio-codec", "codec")
def dac_codec():
    return _job(Seeded(_dac(), lambda m, x: m(x)["audio"]), wave(channels=1), out(1, "time_out"))


@entry("descript-audio-codec", "codec")
def dac_encoder():
    return _job(Seeded(_dac(), lambda m, x: m.encoder(x)), wave(channels=1), out(16, "frames"))


@entry("descript-audio-codec", "codec")
def dac_decoder():
    return _job(Seeded(_dac(), lambda m, z: m.decoder(z)), feats(16, channels_first=True), out(1, "time_out"))


# ---------------------------------------------------------------- snac

def _snac(window):
    _manual()
    import snac
    # dim_head is fixed at 64: the attention needs 64 channels for one head
    return snac.SNAC(sampling_rate=8000, encoder_dim=16, encoder_rates=[2, 4], decoder_dim=64, decoder_rates=[4, 2],
                     attn_window_size=window, codebook_size=32, codebook_dim=4, vq_strides=[4, 2, 1],
                     noise=False)  # its NoiseBlock adds torch.randn in eval too: no two eager runs agree


@entry("snac", "codec")
def snac_codec():
    return _job(Seeded(_snac(None), lambda m, x: m(x)[0]), wave(channels=1), out(1, "time_out"))


@entry("snac", "codec")
def snac_codec_local_attention():
    return _job(Seeded(_snac(8), lambda m, x: m(x)[0]), wave(channels=1), out(1, "time_out"))


# ---------------------------------------------------------------- vocos

@entry("vocos", "vocoder")
def vocos_mel_vocoder():
    _manual()
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone
    model = nn.Sequential(VocosBackbone(input_channels=20, dim=32, intermediate_dim=64, num_layers=2),
                          ISTFTHead(dim=32, n_fft=64, hop_length=16))
    return _job(model, feats(20, channels_first=True), out("time_out"))


@entry("vocos", "spectrogram")
def vocos_mel_features():
    from vocos.feature_extractors import MelSpectrogramFeatures
    model = MelSpectrogramFeatures(sample_rate=8000, n_fft=128, hop_length=32, n_mels=20)
    return _job(model, wave(), out(20, "frames"))


# ---------------------------------------------------------------- torchcrepe: pitch

@entry("torchcrepe", "pitch")
def torchcrepe_tiny():
    """CREPE on frames: ``[B, T, 1024]`` -> pitch-bin probabilities ``[B, T, 360]``."""
    _manual()
    import torchcrepe

    def frames(m, x):
        b, t, n = x.shape
        return m(x.reshape(b * t, n)).reshape(b, t, 360)
    return _job(Seeded(torchcrepe.Crepe("tiny"), frames), feats(1024, example=9, min=2), out("time", 360))


@entry("torchcrepe", "pitch")
def torchcrepe_framing():
    """torchcrepe's own framing of audio (``preprocess``) then the model: one batch of frames per call."""
    _manual()
    import torchcrepe

    def run(m, x):
        frames = next(torchcrepe.preprocess(x, 16000, hop_length=160, batch_size=None, device="cpu", pad=True))
        return m(frames)
    return _job(Seeded(torchcrepe.Crepe("tiny"), run), [TensorSpec("data", [1, Dim("time", min=1600, example=3200)])],
                [TensorSpec("output", [Dim("frames"), 360])])


# ---------------------------------------------------------------- nnAudio: spectrogram layers

def _nnaudio(name, **kw):
    import nnAudio.features as nf
    model = getattr(nf, name)(verbose=False, **kw)
    return model


@entry("nnaudio", "spectrogram")
def nnaudio_stft():
    return _job(_nnaudio("STFT", n_fft=64, hop_length=16, output_format="Magnitude"), wave(), out(33, "frames"))


@entry("nnaudio", "spectrogram")
def nnaudio_melspectrogram():
    return _job(_nnaudio("MelSpectrogram", sr=8000, n_fft=128, n_mels=20, hop_length=32), wave(), out(20, "frames"))


@entry("nnaudio", "spectrogram")
def nnaudio_mfcc():
    return _job(_nnaudio("MFCC", sr=8000, n_mfcc=13, n_fft=128, n_mels=20, hop_length=32), wave(), out(13, "frames"))


@entry("nnaudio", "spectrogram")
def nnaudio_cqt1992v2():
    return _job(_nnaudio("CQT1992v2", sr=8000, hop_length=64, fmin=200, n_bins=24), wave(), out(24, "frames"))


@entry("nnaudio", "spectrogram")
def nnaudio_cqt2010v2():
    return _job(_nnaudio("CQT2010v2", sr=8000, hop_length=64, fmin=200, n_bins=24), wave(), out(24, "frames"))


@entry("nnaudio", "spectrogram")
def nnaudio_gammatonegram():
    return _job(_nnaudio("Gammatonegram", sr=8000, n_fft=128, n_bins=16, hop_length=32), wave(), out(16, "frames"))


# ---------------------------------------------------------------- torchlibrosa

@entry("torchlibrosa", "spectrogram")
def torchlibrosa_logmel():
    import torchlibrosa
    model = nn.Sequential(torchlibrosa.Spectrogram(n_fft=128, hop_length=32),
                          torchlibrosa.LogmelFilterBank(sr=8000, n_fft=128, n_mels=20))
    return _job(model, wave(), out(1, "frames", 20))


@entry("torchlibrosa", "spectrogram")
def torchlibrosa_istft():
    """STFT then torchlibrosa's own ISTFT (overlap-add written with conv layers)."""
    import torchlibrosa

    class RoundTrip(nn.Module):
        def __init__(self):
            super().__init__()
            self.stft = torchlibrosa.STFT(n_fft=64, hop_length=16)
            self.istft = torchlibrosa.ISTFT(n_fft=64, hop_length=16)

        def forward(self, x):
            real, imag = self.stft(x)
            return self.istft(real, imag, x.shape[-1])
    return _job(RoundTrip(), wave(), out("time"))


# ---------------------------------------------------------------- x-transformers

def _xtransformer(**attn):
    _manual()
    from x_transformers import ContinuousTransformerWrapper, Encoder
    model = ContinuousTransformerWrapper(dim_in=20, dim_out=16, max_seq_len=0, use_abs_pos_emb=False,
                                         attn_layers=Encoder(dim=32, depth=2, heads=4, **attn))
    return _job(Seeded(model, lambda m, x, n: m(x, mask=_mask(x, n))), feats(20, lengths=True), out("time", 16))


@entry("x-transformers", "transformer")
def xtransformers_rotary():
    return _xtransformer(rotary_pos_emb=True)


@entry("x-transformers", "transformer")
def xtransformers_alibi():
    return _xtransformer(alibi_pos_bias=True)


@entry("x-transformers", "transformer")
def xtransformers_t5_relpos():
    return _xtransformer(rel_pos_bias=True)


@entry("x-transformers", "transformer")
def xtransformers_dynamic_pos_bias():
    return _xtransformer(dynamic_pos_bias=True)


# ---------------------------------------------------------------- local-attention, rotary-embedding-torch

@entry("local-attention", "transformer")
def local_attention():
    _manual()
    from local_attention import LocalAttention

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(20, 3 * 16)
            self.attn = LocalAttention(window_size=8, causal=False, look_backward=1, look_forward=1, dim=8,
                                       autopad=True)

        def forward(self, x, lengths):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return self.attn(q, k, v, mask=_mask(x, lengths)).transpose(1, 2).reshape(b, t, 16)
    return _job(Block(), feats(20, lengths=True), out("time", 16))


@entry("local-attention", "transformer")
def local_transformer_lm():
    _manual()
    from local_attention import LocalTransformer
    model = LocalTransformer(num_tokens=50, max_seq_len=256, dim=32, depth=2, causal=True, local_attn_window_size=8,
                             heads=2, dim_head=16)
    time = Dim("time", min=8, example=37, max=256)
    return _job(model, [TensorSpec("data", [B, time], dtype=torch.int64, values=(0, 50))], out("time", 50))


@entry("rotary-embedding-torch", "transformer")
def rotary_attention():
    _manual()
    from rotary_embedding_torch import RotaryEmbedding

    class Block(nn.Module):
        def __init__(self, xpos=False):
            super().__init__()
            self.qkv = nn.Linear(20, 3 * 16)
            self.rotary = RotaryEmbedding(dim=8, use_xpos=xpos)
            self.xpos = xpos

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
            if self.xpos:
                q, k = self.rotary.rotate_queries_and_keys(q, k)
            else:
                q, k = self.rotary.rotate_queries_or_keys(q), self.rotary.rotate_queries_or_keys(k)
            att = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)
            return (att @ v).transpose(1, 2).reshape(b, t, 16)
    return _job(Block(), feats(20), out("time", 16))


@entry("rotary-embedding-torch", "transformer")
def rotary_xpos_attention():
    job = rotary_attention()
    job["model"].xpos = True
    from rotary_embedding_torch import RotaryEmbedding
    _manual()
    job["model"].rotary = RotaryEmbedding(dim=8, use_xpos=True)
    return job


# ---------------------------------------------------------------- speechbrain

def _relative(x, lengths):
    return lengths.float() / x.shape[1]


@entry("speechbrain", "speaker")
def speechbrain_ecapa():
    _manual()
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN
    model = ECAPA_TDNN(20, channels=[16, 16, 16, 16, 48], attention_channels=8, se_channels=8, lin_neurons=8,
                       res2net_scale=4)
    return _job(Seeded(model, lambda m, x, n: m(x, _relative(x, n))[:, 0]), feats(20, lengths=True), out(8))


@entry("speechbrain", "speaker")
def speechbrain_xvector():
    _manual()
    from speechbrain.lobes.models.Xvector import Xvector
    model = Xvector(in_channels=20, tdnn_channels=[16, 16, 16, 16, 32], lin_neurons=8)
    return _job(Seeded(model, lambda m, x, n: m(x, _relative(x, n))[:, 0]), feats(20, lengths=True), out(8))


@entry("speechbrain", "asr-encoder")
def speechbrain_crdnn():
    _manual()
    from speechbrain.lobes.models.CRDNN import CRDNN
    from speechbrain.nnet.RNN import LiGRU
    model = CRDNN(input_shape=[None, None, 20], cnn_blocks=1, cnn_channels=[8], rnn_layers=1, rnn_neurons=16,
                  dnn_blocks=1, dnn_neurons=16, dropout=0.0, rnn_class=LiGRU)
    return _job(model, feats(20), out("time", 16))


@entry("speechbrain", "asr-encoder")
def speechbrain_conformer():
    _manual()
    from speechbrain.lobes.models.transformer.Conformer import ConformerEncoder
    from speechbrain.nnet.attention import RelPosEncXL
    model = ConformerEncoder(num_layers=2, d_model=32, d_ffn=64, nhead=4, kernel_size=7)
    pos = RelPosEncXL(32)

    def run(m, x, n):
        return m(x, src_key_padding_mask=~_mask(x, n), pos_embs=pos(x))[0]
    return _job(Seeded(model, run), feats(32, lengths=True), out("time", 32))


@entry("speechbrain", "separation")
def speechbrain_sepformer():
    _manual()
    from speechbrain.lobes.models.dual_path import Decoder, Dual_Path_Model, Encoder, SBTransformerBlock

    class SepFormer(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Encoder(kernel_size=16, out_channels=16)
            block = lambda: SBTransformerBlock(num_layers=1, d_model=16, nhead=2, d_ffn=32, dropout=0.0)
            self.mask = Dual_Path_Model(16, 16, block(), block(), num_layers=1, K=25, num_spks=2)
            self.dec = Decoder(in_channels=16, out_channels=1, kernel_size=16, stride=8, bias=False)

        def forward(self, x):
            w = self.enc(x)
            masks = self.mask(w)
            return torch.stack([self.dec(w * masks[i]) for i in range(2)], -1)
    return _job(SepFormer(), wave(), out("time_out", 2))


@entry("speechbrain", "enhancement")
def speechbrain_metricgan():
    _manual()
    from speechbrain.lobes.models.MetricGAN import EnhancementGenerator
    model = EnhancementGenerator(input_size=33, hidden_size=200, num_layers=1)  # its Linear takes 400
    return _job(Seeded(model, lambda m, x, n: m(x, lengths=_relative(x, n))), feats(33, lengths=True),
                out("time", 257))


@entry("speechbrain", "spectrogram")
def speechbrain_fbank():
    from speechbrain.lobes.features import Fbank
    return _job(Fbank(sample_rate=8000, n_fft=256, n_mels=20), wave(), out("frames", 20))


@entry("speechbrain", "vocoder")
def speechbrain_hifigan():
    _manual()
    from speechbrain.lobes.models.HifiGAN import HifiganGenerator
    model = HifiganGenerator(in_channels=20, out_channels=1, resblock_type="1",
                             resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], resblock_kernel_sizes=[3, 5],
                             upsample_kernel_sizes=[8, 8], upsample_initial_channel=16, upsample_factors=[4, 4])
    return _job(model, feats(20, channels_first=True), out(1, "time_out"))


# ---------------------------------------------------------------- torchaudio models and transforms

@entry("torchaudio", "asr-encoder")
def torchaudio_conformer():
    _manual()
    import torchaudio.models as tm
    model = tm.Conformer(input_dim=20, num_heads=4, ffn_dim=32, num_layers=2, depthwise_conv_kernel_size=7)
    return _job(model, feats(20, lengths=True), out("time", 20, lengths=[1]))


@entry("torchaudio", "asr-encoder")
def torchaudio_emformer():
    _manual()
    import torchaudio.models as tm
    model = tm.Emformer(input_dim=20, num_heads=4, ffn_dim=32, num_layers=2, segment_length=4,
                        right_context_length=1)
    return _job(model, feats(20, lengths=True), out("time_out", 20, lengths=[1]))


@entry("torchaudio", "separation")
def torchaudio_convtasnet():
    _manual()
    import torchaudio.models as tm
    model = tm.ConvTasNet(num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3, msk_num_feats=16,
                          msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=1)
    return _job(model, wave(channels=1), out(2, "time_out"))


@entry("torchaudio", "separation")
def torchaudio_hdemucs():
    _manual()
    import torchaudio.models as tm
    model = tm.HDemucs(sources=["a", "b"], audio_channels=1, channels=8, depth=2, nfft=64)
    return _job(model, wave(channels=1, example=4096, min=1024), out(2, 1, "time"))


@entry("torchaudio", "asr-encoder")
def torchaudio_wav2letter():
    _manual()
    import torchaudio.models as tm
    return _job(tm.Wav2Letter(num_classes=10, input_type="mfcc", num_features=20), feats(20, channels_first=True),
                out(10, "time_out"))


@entry("torchaudio", "asr-encoder")
def torchaudio_deepspeech():
    _manual()
    import torchaudio.models as tm
    model = tm.DeepSpeech(n_feature=20, n_hidden=16, n_class=10)
    return _job(Seeded(model, lambda m, x: m(x[:, None])), feats(20), out("time", 10))


@entry("torchaudio", "asr-encoder")
def torchaudio_wav2vec2():
    _manual()
    import torchaudio.models as tm
    model = tm.wav2vec2_model("group_norm", [(8, 10, 5), (8, 3, 2), (8, 2, 2)], False, 16, 0.0, 16, 4, 2, 2, 0.0, 32,
                              0.0, 0.0, False, 0.0, 10)
    return _job(model, wave(lengths=True), out("frames", 10, lengths=[1]))


@entry("torchaudio", "spectrogram")
def torchaudio_mfcc():
    import torchaudio.transforms as tt
    model = tt.MFCC(sample_rate=8000, n_mfcc=13, melkwargs=dict(n_fft=128, hop_length=32, n_mels=20))
    return _job(model, wave(), out(13, "frames"))


@entry("torchaudio", "resampling")
def torchaudio_resample():
    import torchaudio.transforms as tt
    return _job(tt.Resample(16000, 22050), wave(), out("time_out"))


# ---------------------------------------------------------------- demucs, openunmix, bs-roformer: music separation

@entry("demucs", "separation")
def demucs_v2():
    _manual()
    from demucs.demucs import Demucs
    model = Demucs(sources=["a", "b"], audio_channels=1, channels=8, depth=2, lstm_layers=1, resample=False)
    return _job(model, wave(channels=1, example=4096, min=1024), out(2, 1, "time"))


@entry("demucs", "separation")
def demucs_htdemucs():
    _manual()
    from demucs.htdemucs import HTDemucs
    model = HTDemucs(sources=["a", "b"], audio_channels=1, channels=8, depth=2, nfft=256, t_layers=1, t_heads=2,
                     bottom_channels=0, segment=1, samplerate=8000)
    return _job(model, wave(channels=1, example=4096, min=1024), out(2, 1, "time"))


@entry("openunmix", "separation")
def openunmix_spectrogram():
    _manual()
    from openunmix.model import OpenUnmix
    model = OpenUnmix(nb_bins=33, nb_channels=1, hidden_size=16, nb_layers=1)
    spec = [TensorSpec("data", [B, 1, 33, Dim("time", min=8, example=37)])]
    return _job(model, spec, out(1, 33, "time"))


@entry("openunmix", "separation")
def openunmix_separator():
    _manual()
    from openunmix.model import OpenUnmix, Separator
    umx = OpenUnmix(nb_bins=33, nb_channels=1, hidden_size=16, nb_layers=1)
    model = Separator({"vocals": umx}, n_fft=64, n_hop=16, nb_channels=1, sample_rate=8000.0)
    return _job(model, wave(channels=1), out(1, 1, "time_out"))


@entry("bs-roformer", "separation")
def bs_roformer():
    _manual()
    from bs_roformer import BSRoformer
    model = BSRoformer(dim=16, depth=1, freqs_per_bands=(4, 4, 8, 17), dim_freqs_in=33, stft_n_fft=64,
                       stft_hop_length=16, stft_win_length=64, heads=2, dim_head=8, flash_attn=False,
                       time_transformer_depth=1, freq_transformer_depth=1, mask_estimator_depth=1)
    return _job(model, wave(), out(1, "time_out"))


@entry("bs-roformer", "separation")
def mel_band_roformer():
    _manual()
    from bs_roformer import MelBandRoformer
    model = MelBandRoformer(dim=16, depth=1, num_bands=4, dim_freqs_in=33, stft_n_fft=64, stft_hop_length=16,
                            stft_win_length=64, heads=2, dim_head=8, flash_attn=False, sample_rate=8000,
                            time_transformer_depth=1, freq_transformer_depth=1, attn_dropout=0.0, ff_dropout=0.0)
    return _job(model, wave(), out(1, "time_out"))


# ---------------------------------------------------------------- whisper

@entry("openai-whisper", "asr-encoder")
def whisper_encoder():
    _manual()
    from whisper.model import AudioEncoder
    model = AudioEncoder(n_mels=20, n_ctx=20, n_state=32, n_head=4, n_layer=2)
    # its forward asserts the input is exactly 2 * n_ctx frames (whisper pads to 30 s): only the batch is dynamic
    return _job(model, [TensorSpec("data", [B, 20, 40])], out(20, 32))


@entry("openai-whisper", "spectrogram")
def whisper_log_mel():
    import whisper

    class LogMel(nn.Module):
        def forward(self, x):
            return whisper.log_mel_spectrogram(x, n_mels=80)
    return _job(LogMel(), wave(), out(80, "frames"))


# ---------------------------------------------------------------- vector-quantize-pytorch

@entry("vector-quantize-pytorch", "codec")
def residual_vq():
    _manual()
    from vector_quantize_pytorch import ResidualVQ
    model = ResidualVQ(dim=16, num_quantizers=2, codebook_size=32)
    return _job(Seeded(model, lambda m, x: m(x)[0]), feats(16), out("time", 16))


@entry("vector-quantize-pytorch", "codec")
def fsq():
    _manual()
    from vector_quantize_pytorch import FSQ
    model = FSQ(levels=[8, 5, 5], dim=16)
    return _job(Seeded(model, lambda m, x: m(x)[0]), feats(16), out("time", 16))


# ---------------------------------------------------------------- bigvgan, pytorch-tcn

@entry("bigvgan", "vocoder")
def bigvgan_generator():
    _manual()
    import bigvgan
    from bigvgan.env import AttrDict
    h = AttrDict(dict(num_mels=20, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8], upsample_initial_channel=16,
                      resblock="1", resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
                      activation="snakebeta", snake_logscale=True, use_tanh_at_final=False, use_bias_at_final=False))
    return _job(bigvgan.BigVGAN(h), feats(20, channels_first=True), out(1, "time_out"))


@entry("pytorch-tcn", "sequence")
def pytorch_tcn():
    _manual()
    from pytorch_tcn import TCN
    model = TCN(20, [16, 16], kernel_size=3, causal=True, dropout=0.0)
    return _job(model, feats(20, channels_first=True), out(16, "time"))



# ---------------------------------------------------------------- DeepFilterNet3: speech enhancement (issue #47, 9)

def _df_package():
    """``df``'s modules without its ``__init__``: that imports ``df.enhance`` -> ``df.io``, which needs
    ``torchaudio.backend`` (gone from torchaudio 2.x); the model's own modules do not."""
    import importlib.util
    import sys
    import types
    if "df" not in sys.modules:
        pkg = types.ModuleType("df")
        pkg.__path__ = list(importlib.util.find_spec("df").submodule_search_locations)
        sys.modules["df"] = pkg


@entry("deepfilternet", "enhancement")
def deepfilternet3():
    """DfNet of DeepFilterNet3 at its default config (48 kHz, 960-point FFT, 32 ERB bands, 96 deep-filter bins,
    order 5), random init; its inputs are the spectrum and features libdf computes: ``[B, 1, T, F, 2]`` real
    views of complex spectra."""
    _df_package()
    from df.config import config
    import df.deepfilternet3 as dfn3
    if config.parser is None:
        config.use_defaults()
    _manual()
    model = dfn3.init_model()
    time = Dim("time", min=8, example=37)
    inputs = [TensorSpec("spec", [B, 1, time, 481, 2]), TensorSpec("feat_erb", [B, 1, time, 32]),
              TensorSpec("feat_spec", [B, 1, time, 96, 2])]
    outputs = [TensorSpec("spec_e", [B, 1, time, 481, 2]), TensorSpec("erb_mask", [B, 1, time, 32]),
               TensorSpec("lsnr", [B, time, 1]), TensorSpec("df_coefs", [B, 5, time, 96, 2])]
    return _job(model, inputs, outputs)

# the second round's models register themselves into ENTRIES (round=2)
import sweep_models2  # noqa: E402,F401
# the third round's models (round=3): OCR, time series and NLP; then speech, music and state-space models
import sweep_models3  # noqa: E402,F401
import sweep_models3b  # noqa: E402,F401
# the probe after round three (round=4): sequence models from libraries no round used
import sweep_models4  # noqa: E402,F401
# a second probe (round=5): long convolutions, gated recurrences, other attentions, models with memories
import sweep_models5  # noqa: E402,F401
