"""A probe after round three (issue #47): first contact with sequence models from libraries that no sweep round
and no test uses, to check that ``export(auto)`` is never below a plain or patched exporter on models nobody here
saw (``sweep.py --round 4``).

Same rules as ``sweep_models.py``. s5-pytorch was tried too and left out: its own initialisation (``vmap`` over
``torch.rand``) fails on torch 2.13 before any export.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, _mask, entry, feats, out


def _r4(library, kind):
    return entry(library, kind, round=4)


@_r4("nystrom-attention", "transformer")
def nystromformer():
    _manual()
    from nystrom_attention import Nystromformer
    return _job(Nystromformer(dim=32, dim_head=8, heads=4, depth=2, num_landmarks=8, pinv_iterations=6),
                feats(32, example=37, min=8), out("time", 32))


@_r4("nystrom-attention", "transformer")
def nystromformer_masked():
    _manual()
    from nystrom_attention import Nystromformer
    model = Nystromformer(dim=32, dim_head=8, heads=4, depth=1, num_landmarks=8, pinv_iterations=6)
    return _job(Seeded(model, lambda m, x, n: (m(x, mask=_mask(x, n)), n)), feats(32, example=37, min=8, lengths=True),
                out("time", 32, lengths=[1]))


@_r4("perceiver-pytorch", "classifier")
def perceiver():
    _manual()
    from perceiver_pytorch import Perceiver
    model = Perceiver(input_channels=16, input_axis=1, num_freq_bands=6, max_freq=10., depth=2, num_latents=16,
                      latent_dim=32, cross_heads=1, latent_heads=4, cross_dim_head=8, latent_dim_head=8,
                      num_classes=5, attn_dropout=0., ff_dropout=0., weight_tie_layers=False)
    return _job(model, feats(16, example=37, min=8), [TensorSpec("output", [B, 5])])


@_r4("perceiver-pytorch", "sequence")
def perceiver_io():
    _manual()
    from perceiver_pytorch import PerceiverIO
    model = PerceiverIO(dim=16, queries_dim=16, logits_dim=7, depth=2, num_latents=16, latent_dim=32,
                        cross_heads=1, latent_heads=4, cross_dim_head=8, latent_dim_head=8)
    return _job(Seeded(model, lambda m, x: m(x, queries=x)), feats(16, example=37, min=8), out("time", 7))


@_r4("charformer-pytorch", "tokenizer")
def charformer_gbst():
    _manual()
    from charformer_pytorch import GBST
    model = GBST(num_tokens=50, dim=32, max_block_size=4, downsample_factor=4, score_consensus_attn=True)
    time = Dim("tokens", min=8, example=37)
    return _job(Seeded(model, lambda m, x: m(x)[0]), [TensorSpec("data", [B, time], dtype=torch.int64, values=(0, 50))],
                out("blocks", 32))


class _SNN(nn.Module):
    """snntorch's tutorial network: Linear -> Leaky, stepped over time in the forward."""

    def __init__(self, snn, features=16, hidden=32, classes=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, hidden), nn.Linear(hidden, classes)
        self.lif1, self.lif2 = snn.Leaky(beta=0.9), snn.Leaky(beta=0.8)

    def forward(self, x):
        mem1, mem2 = self.lif1.init_leaky(), self.lif2.init_leaky()
        mems = []
        for step in range(x.size(1)):
            spk1, mem1 = self.lif1(self.fc1(x[:, step]), mem1)
            spk2, mem2 = self.lif2(self.fc2(spk1), mem2)
            mems.append(mem2)
        return torch.stack(mems, dim=1)


@_r4("snntorch", "spiking")
def snntorch_leaky():
    _manual()
    import snntorch as snn
    return _job(_SNN(snn), feats(16, example=37, min=8), out("time", 8))


class _SNNSynaptic(nn.Module):
    """Time-first input, a Synaptic (two-state) neuron and a recurrent Leaky, unbind over time."""

    def __init__(self, snn, features=16, hidden=32, classes=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, hidden), nn.Linear(hidden, classes)
        self.syn = snn.Synaptic(alpha=0.9, beta=0.8)
        self.rlif = snn.RLeaky(beta=0.9, linear_features=classes)

    def forward(self, x):  # [T, B, F]
        syn, mem = self.syn.init_synaptic()
        spk2, mem2 = self.rlif.init_rleaky()
        out = []
        for x_t in x:
            spk1, syn, mem = self.syn(self.fc1(x_t), syn, mem)
            spk2, mem2 = self.rlif(self.fc2(spk1), spk2, mem2)
            out.append(mem2)
        return torch.stack(out)


@_r4("snntorch", "spiking")
def snntorch_synaptic_rleaky():
    _manual()
    import snntorch as snn
    time = Dim("time", min=8, example=37)
    return _job(_SNNSynaptic(snn), [TensorSpec("data", [time, B, 16])],
                [TensorSpec("output", [Dim("time"), B, 8])])


@_r4("performer-pytorch", "transformer")
def performer():
    _manual()
    from performer_pytorch import Performer
    model = Performer(dim=32, depth=1, heads=4, dim_head=8, causal=False, nb_features=16)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r4("performer-pytorch", "language-model")
def performer_causal_lm():
    _manual()
    from performer_pytorch import PerformerLM
    model = PerformerLM(num_tokens=30, max_seq_len=256, dim=32, depth=1, heads=4, dim_head=8, causal=True,
                        nb_features=16)
    time = Dim("tokens", min=8, example=37, max=256)
    return _job(model, [TensorSpec("data", [B, time], dtype=torch.int64, values=(0, 30))], out("tokens", 30))


def _tokens(n, example=37, min=8, max=None, multiple=1, low=0):
    time = Dim("tokens", min=min, example=example, max=max, multiple=multiple)
    return [TensorSpec("data", [B, time], dtype=torch.int64, values=(low, n))]


@_r4("deep-phonemizer", "g2p")
def dp_forward_transformer():
    _manual()
    from dp.model.model import ForwardTransformer
    model = ForwardTransformer(encoder_vocab_size=30, decoder_vocab_size=40, d_model=32, d_fft=64, layers=2,
                               dropout=0.0, heads=2)
    return _job(Seeded(model, lambda m, x: m({"text": x})), _tokens(30, low=1), out("tokens", 40))


@_r4("hourglass-transformer-pytorch", "language-model")
def hourglass_lm():
    _manual()
    from hourglass_transformer_pytorch import HourglassTransformerLM
    model = HourglassTransformerLM(num_tokens=30, dim=32, max_seq_len=256, depth=(1, 1, 1), shorten_factor=2,
                                   heads=2, dim_head=8, causal=True)
    return _job(model, _tokens(30, example=38, max=256, multiple=2), out("tokens", 30))


@_r4("memory-efficient-attention-pytorch", "attention")
def flash_attention_causal():
    _manual()
    from memory_efficient_attention_pytorch import FlashAttention
    model = FlashAttention(dim=32, heads=4, dim_head=8, causal=True, q_bucket_size=16, k_bucket_size=16)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r4("memory-efficient-attention-pytorch", "attention")
def memory_efficient_attention():
    _manual()
    from memory_efficient_attention_pytorch import Attention
    model = Attention(dim=32, heads=4, dim_head=8, causal=False, memory_efficient=True, q_bucket_size=16,
                      k_bucket_size=16)
    return _job(model, feats(32, example=37, min=8), out("time", 32))


@_r4("reformer-pytorch", "language-model")
def reformer_lm():
    _manual()
    from reformer_pytorch import ReformerLM
    model = ReformerLM(num_tokens=30, dim=32, depth=1, max_seq_len=256, heads=2, bucket_size=8, lsh_dropout=0.,
                       causal=False)
    return _job(model, _tokens(30, example=48, min=16, max=256, multiple=16), out("tokens", 30))


@_r4("linear-attention-transformer", "language-model")
def linear_attention_lm():
    _manual()
    from linear_attention_transformer import LinearAttentionTransformerLM
    model = LinearAttentionTransformerLM(num_tokens=30, dim=32, heads=4, depth=1, max_seq_len=256, causal=True,
                                         ff_dropout=0.)
    return _job(model, _tokens(30, max=256), out("tokens", 30))


@_r4("block-recurrent-transformer-pytorch", "language-model")
def block_recurrent_lm():
    _manual()
    from block_recurrent_transformer_pytorch import BlockRecurrentTransformer
    model = BlockRecurrentTransformer(num_tokens=30, dim=32, depth=2, dim_head=8, heads=2, max_seq_len=256,
                                      block_width=16, num_state_vectors=8, recurrent_layers=(2,))
    return _job(Seeded(model, lambda m, x: m(x)[0]), _tokens(30, max=256), out("tokens", 30))


class _NeuralCDE(nn.Module):
    """torchcde's README model: a cubic spline of the series, a CDE solved over it with a fixed-step RK4."""

    def __init__(self, torchcde, channels=4, hidden=8, classes=3):
        super().__init__()
        self.torchcde = torchcde
        self.initial = nn.Linear(channels, hidden)
        self.func = _CDEFunc(channels, hidden)
        self.readout = nn.Linear(hidden, classes)

    def forward(self, x):
        coeffs = self.torchcde.hermite_cubic_coefficients_with_backward_differences(x)
        X = self.torchcde.CubicSpline(coeffs)
        z0 = self.initial(X.evaluate(X.interval[0]))
        z = self.torchcde.cdeint(X=X, func=self.func, z0=z0, t=X.interval, method="rk4",
                                 options=dict(step_size=1.0))
        return self.readout(z[:, 1])


class _CDEFunc(nn.Module):
    def __init__(self, channels, hidden):
        super().__init__()
        self.channels, self.hidden = channels, hidden
        self.linear = nn.Linear(hidden, hidden * channels)

    def forward(self, t, z):
        return torch.tanh(self.linear(z)).view(z.size(0), self.hidden, self.channels)


@_r4("torchcde", "time-series")
def torchcde_neural_cde():
    _manual()
    import torchcde
    return _job(_NeuralCDE(torchcde), feats(4, example=37, min=8), [TensorSpec("output", [B, 3])])
