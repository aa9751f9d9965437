"""The sweep's third round (issue #47, Deliver 4), second half: speech, music and state-space / recurrent
sequence models from libraries that neither earlier round nor the tests use.

Same rules as ``sweep_models.py``; registered with ``round=3`` (``sweep.py --round 3``). The OCR,
time-series and NLP models of round three are in ``sweep_models3.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out, wave  # noqa: F401


def _r3(library: str, kind: str):
    return entry(library, kind, round=3)


def _lengths_of(padding_mask):
    """A padding mask (True where padded) as lengths: the output lengths a user reads from it."""
    return (~padding_mask).sum(-1)


def _wave_mask(data, lengths):
    """The padding mask s3prl's upstream experts build from the wave lengths (True where padded)."""
    return torch.arange(data.shape[1], device=data.device)[None, :] >= lengths[:, None]


# ---------------------------------------------------------------- s3prl: speech SSL encoders (its own upstream code)

_SSL = dict(extractor_mode="default", encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64,
            encoder_attention_heads=4, conv_feature_layers="[(32,10,5)] + [(32,3,2)] * 2 + [(32,2,2)]",
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
            dropout_input=0.0, dropout_features=0.0, conv_pos=16, conv_pos_groups=4, feature_grad_mult=0.0)


def _ssl_job(model):
    """The upstream expert's call: wave and its padding mask in, features and the frames' padding mask out."""
    def run(m, x, n):
        features, mask = m.extract_features(x, padding_mask=_wave_mask(x, n), mask=False)
        return features, _lengths_of(mask)
    return _job(Seeded(model, run), wave(example=4000, min=1600, lengths=True), out("frames", 32, lengths=[1]))


@_r3("s3prl", "speech-ssl")
def s3prl_wavlm():
    """WavLM: gated relative position bias (bucketed distances), a conv feature extractor, the wave's padding mask."""
    _manual()
    from s3prl.upstream.wavlm.WavLM import WavLM, WavLMConfig
    cfg = WavLMConfig(dict(_SSL, relative_position_embedding=True, num_buckets=32, max_distance=128,
                           gru_rel_pos=True, layer_norm_first=False))
    return _ssl_job(WavLM(cfg))


@_r3("s3prl", "speech-ssl")
def s3prl_hubert():
    _manual()
    from s3prl.upstream.hubert.hubert_model import HubertConfig, HubertModel, HubertPretrainingConfig
    cfg = HubertConfig(label_rate=50.0, **{k: v for k, v in _SSL.items()}, final_dim=16)
    model = HubertModel(cfg, HubertPretrainingConfig(label_rate=50.0), [list("abcdefgh")])
    return _ssl_job(model)


# ---------------------------------------------------------------- beat-this: beat and downbeat tracking

def _beat_this(**kw):
    _manual()
    from beat_this.model.beat_tracker import BeatThis
    model = BeatThis(spect_dim=32, transformer_dim=32, ff_mult=2, n_layers=1, head_dim=8, stem_dim=8,
                     dropout={"frontend": 0.0, "transformer": 0.0}, **kw)
    # the mel spectrogram [B, frames, mel] in, beat and downbeat logits [B, frames] out
    return _job(Seeded(model, lambda m, x: tuple(m(x)[k] for k in ("beat", "downbeat"))), feats(32, example=64, min=16),
                [TensorSpec("beat", [B, Dim("time")]), TensorSpec("downbeat", [B, Dim("time")])])


@_r3("beat-this", "beat-tracking")
def beat_this():
    return _beat_this()


@_r3("beat-this", "beat-tracking")
def beat_this_plain():
    """Without the frequency/time partial transformers of the frontend, and with independent heads."""
    return _beat_this(partial_transformers=False, sum_head=False)


# ---------------------------------------------------------------- clearvoice: speech enhancement and separation

@_r3("clearvoice", "enhancement")
def clearvoice_frcrn():
    """FRCRN (two complex U-Nets, channels fixed by the depth-14 table) with its conv STFT/iSTFT; output[1] is the wave."""
    _manual()
    from clearvoice.models.frcrn_se.frcrn import DCCRN
    model = DCCRN(complex=True, model_complexity=45, model_depth=14, log_amp=False, padding_mode="zeros",
                  win_len=640, win_inc=320, fft_len=640, win_type="hanning")
    return _job(Seeded(model, lambda m, x: m(x)[1]), wave(example=4800, min=1600), out("time_out"))


@_r3("clearvoice", "enhancement")
def clearvoice_mossformer2_se():
    """MossFormer2's mask net (gated attention + FSMN memory) over fbank features, as MossFormer2_SE_48K runs it."""
    _manual()
    from clearvoice.models.mossformer2_se.mossformer2 import MossFormer_MaskNet
    model = MossFormer_MaskNet(in_channels=20, out_channels=32, out_channels_final=20, num_blocks=2, num_spks=1,
                               max_length=2000)
    return _job(model, feats(20, example=64, min=16, channels_first=True), out("time", 20))


@_r3("clearvoice", "separation")
def clearvoice_mossformer2_ss():
    _manual()
    from clearvoice.models.mossformer2_ss.mossformer2 import MossFormer
    model = MossFormer(in_channels=32, out_channels=32, num_blocks=2, kernel_size=16, num_spks=2, max_length=4000)
    return _job(Seeded(model, lambda m, x: tuple(m(x))), wave(example=4000, min=800),
                [TensorSpec("spk1", [B, Dim("time_out")]), TensorSpec("spk2", [B, Dim("time_out")])])


# ---------------------------------------------------------------- nara-wpe: WPE dereverberation (its torch version)

@_r3("nara-wpe", "dereverberation")
def nara_wpe():
    """torch_wpe.wpe_v6 on a multichannel STFT, as the package's examples run it (frequency bins first)."""
    from nara_wpe import torch_wpe

    class Wpe(nn.Module):
        def forward(self, data):
            window = torch.hann_window(128, device=data.device)
            spec = torch.stft(data.reshape(-1, data.shape[-1]), 128, 32, window=window, return_complex=True)
            spec = spec.reshape(data.shape[0], data.shape[1], spec.shape[-2], spec.shape[-1])
            clean = torch_wpe.wpe_v6(spec.permute(0, 2, 1, 3), taps=4, delay=2, iterations=2)
            clean = clean.permute(0, 2, 1, 3).reshape(-1, spec.shape[-2], spec.shape[-1])
            wave_out = torch.istft(clean, 128, 32, window=window, length=data.shape[-1])
            return wave_out.reshape(data.shape)
    return _job(Wpe(), wave(channels=2, example=4000, min=1600), out(2, "time"))


# ---------------------------------------------------------------- mambapy: Mamba and Jamba in plain PyTorch

def _mamba(pscan: bool):
    _manual()
    from mambapy.mamba import Mamba, MambaConfig
    model = Mamba(MambaConfig(d_model=16, n_layers=2, d_state=8, expand_factor=2, d_conv=4, pscan=pscan))
    return _job(model, feats(16, example=37, min=8), out("time", 16))


@_r3("mambapy", "state-space")
def mambapy_mamba():
    """The parallel (Blelloch) scan over a length padded to the next power of two: what mambapy runs by default."""
    return _mamba(pscan=True)


@_r3("mambapy", "state-space")
def mambapy_mamba_sequential():
    """The same model with its sequential selective scan (pscan=False): a Python loop over time."""
    return _mamba(pscan=False)


@_r3("mambapy", "state-space")
def mambapy_jamba():
    """Jamba: Mamba layers with a mixture-of-experts MLP, interleaved with grouped-query attention."""
    _manual()
    from mambapy.jamba import Jamba, JambaLMConfig
    cfg = JambaLMConfig(d_model=16, n_layers=2, mlp_size=32, d_state=8, num_attention_heads=4,
                        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, attn_layer_offset=1,
                        attn_layer_period=2, expert_layer_offset=0, expert_layer_period=2)
    return _job(Seeded(Jamba(cfg), lambda m, x: m(x)[0]), feats(16, example=37, min=8), out("time", 16))


# ---------------------------------------------------------------- xlstm: sLSTM and mLSTM stacks (vanilla backend)

def _xlstm(slstm: bool):
    _manual()
    from xlstm import (FeedForwardConfig, mLSTMBlockConfig, mLSTMLayerConfig, sLSTMBlockConfig, sLSTMLayerConfig,
                       xLSTMBlockStack, xLSTMBlockStackConfig)
    cfg = xLSTMBlockStackConfig(
        mlstm_block=mLSTMBlockConfig(mlstm=mLSTMLayerConfig(conv1d_kernel_size=4, qkv_proj_blocksize=4, num_heads=2)),
        slstm_block=sLSTMBlockConfig(slstm=sLSTMLayerConfig(backend="vanilla", num_heads=2, conv1d_kernel_size=4,
                                                            bias_init="powerlaw_blockdependent"),
                                     feedforward=FeedForwardConfig(proj_factor=1.3, act_fn="gelu")),
        context_length=64, num_blocks=2, embedding_dim=16, slstm_at=[0, 1] if slstm else [])
    # the causal mask of the mLSTM is the context length's: sequences up to it
    return _job(xLSTMBlockStack(cfg), [TensorSpec("data", [B, Dim("time", min=8, example=37, max=64), 16])],
                out("time", 16))


@_r3("xlstm", "recurrent")
def xlstm_slstm():
    """sLSTM blocks, vanilla (PyTorch) backend: a recurrent cell stepped over time."""
    return _xlstm(slstm=True)


@_r3("xlstm", "recurrent")
def xlstm_mlstm():
    """mLSTM blocks: the parallel (attention-like) form with a causal, gate-weighted decay matrix."""
    return _xlstm(slstm=False)


# ---------------------------------------------------------------- minGRU-pytorch: minimal GRU/LSTM (log-space scan)

@_r3("minGRU-pytorch", "recurrent")
def mingru():
    """minGRU's parallel mode: the Heinsen log-space scan (logcumsumexp) over the whole sequence."""
    _manual()
    from minGRU_pytorch import minGRU
    return _job(minGRU(16, expansion_factor=1.5), feats(16, example=37, min=8), out("time", 16))


@_r3("minGRU-pytorch", "recurrent")
def mingru_minlstm():
    _manual()
    from minGRU_pytorch.minLSTM import minLSTM
    return _job(minLSTM(16, expansion_factor=1.5), feats(16, example=37, min=8), out("time", 16))


@_r3("minGRU-pytorch", "language-model")
def mingru_minlm():
    """minLM: token embedding, causal depthwise convs, minGRU layers, feed-forwards, logits."""
    _manual()
    from minGRU_pytorch.minLM import minLM
    model = minLM(num_tokens=30, dim=16, depth=2, ff_mult=2, expansion=1.5, conv_kernel_size=3)
    time = Dim("tokens", min=4, example=13)
    return _job(model, [TensorSpec("data", [B, time], dtype=torch.int64, values=(0, 30))], out("tokens", 30))


# ---------------------------------------------------------------- sru: Simple Recurrent Units (CPU path)

@_r3("sru", "recurrent")
def sru():
    """SRU's CPU recurrence with its padding mask (time-major, as the library takes it)."""
    _manual()
    from sru import SRU
    model = SRU(16, 16, num_layers=2, bidirectional=True, dropout=0.0, rescale=True, layer_norm=False)

    def run(m, x, n):
        pad = torch.arange(x.shape[1], device=x.device)[:, None] >= n[None, :]  # [T, B], True where padded
        h, _ = m(x.transpose(0, 1), mask_pad=pad)
        return h.transpose(0, 1), n
    return _job(Seeded(model, run), feats(16, example=37, min=8, lengths=True), out("time", 32, lengths=[1]))


# ---------------------------------------------------------------- music2latent: the consistency autoencoder's encoder

@_r3("music2latent", "music-codec")
def music2latent_encoder():
    """The encoder of music2latent (its default architecture, random init): its own STFT of the stereo-free
    wave, a 2-D then 1-D conv/attention stack, latents at 1/4096 of the sample rate."""
    _manual()
    from music2latent.audio import to_representation_encoder
    from music2latent.models import Encoder

    class Encode(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = Encoder()

        def forward(self, data):
            return self.encoder(to_representation_encoder(data))
    return _job(Encode(), wave(example=16384, min=8192, multiple=4096), out(64, "latents"))
