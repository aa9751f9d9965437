"""A VITS voice written the way piper's and coqui's training code writes it, at a tiny size.

The classes follow piper's ``piper_train/vits`` (``models.py``, ``modules.py``, ``attentions.py``, ``commons.py``,
themselves jaywalnut310/vits with coqui-tts' changes): a ``TextEncoder`` (token embedding, a transformer encoder
with windowed relative-position attention, whose ``_get_relative_embeddings`` pads and slices by Python ``max``),
a duration predictor (the deterministic ``DurationPredictor``; piper's default ``StochasticDurationPredictor`` is
not reproduced here), a ``ResidualCouplingBlock`` flow of ``WN`` coupling layers and ``Flip``, a HiFi-GAN
``Generator`` as the decoder, the speaker embedding ``emb_g`` of a multi-speaker voice, and ``infer`` with the
length regulator (``ceil`` of the durations, ``generate_path``) and the prior's noise
(``torch.randn_like(m_p) * exp(logs_p) * noise_scale``). ``PosteriorEncoder`` is kept for the structure (training
only). Two differences from piper, both at inference no-ops: no ``weight_norm`` (piper's export calls
``remove_weight_norm`` first) and ``fused_add_tanh_sigmoid_multiply`` is a plain function (piper scripts it).

Checked against piper's real classes (rhasspy/piper 73c04d8 ``src/python/piper_train/vits``, read from a scratch
copy outside the repository, its compiled ``monotonic_align`` stubbed): with piper's fixed numbers
(``flow_layers=4, n_flows=4, posterior_layers=16, dp_filter_channels=256``) the state dict loads strictly into
piper's ``SynthesizerTrn(..., resblock="2", use_sdp=False)`` once its ``weight_norm`` is removed, and ``infer``
gives the same audio to the bit (max difference 0.0, 1 and 3 speakers, noise scales 0).

The graph sherpa-onnx loads wraps ``infer`` as piper's ``export_onnx.py`` does (``PiperGraph`` in
``onnx_compat/parts/sherpa_tts.py``). ``tiny_voice`` is a symbol table of piper's layout and a lexicon spelled
with it.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

LRELU_SLOPE = 0.1


def convert_pad_shape(pad_shape):
    return [item for sublist in pad_shape[::-1] for item in sublist]


def sequence_mask(length, max_length=None):
    if max_length is None:
        max_length = length.max()
    x = torch.arange(max_length, dtype=length.dtype, device=length.device)
    return x.unsqueeze(0) < length.unsqueeze(1)


def generate_path(duration, mask):
    """duration [b, 1, t_x], mask [b, 1, t_y, t_x] -> the monotonic alignment path [b, 1, t_y, t_x]."""
    b, _, t_y, t_x = mask.shape
    cum_duration = torch.cumsum(duration, -1)
    cum_duration_flat = cum_duration.view(b * t_x)
    path = sequence_mask(cum_duration_flat, t_y).type_as(mask)
    path = path.view(b, t_x, t_y)
    path = path - F.pad(path, convert_pad_shape([[0, 0], [1, 0], [0, 0]]))[:, :-1]
    return path.unsqueeze(1).transpose(2, 3) * mask


def fused_add_tanh_sigmoid_multiply(input_a, input_b, n_channels):
    n_channels_int = n_channels[0]
    in_act = input_a + input_b
    t_act = torch.tanh(in_act[:, :n_channels_int, :])
    s_act = torch.sigmoid(in_act[:, n_channels_int:, :])
    return t_act * s_act


def get_padding(kernel_size, dilation=1):
    return int((kernel_size * dilation - dilation) / 2)


class LayerNorm(nn.Module):
    """Channels-first layer norm (``modules.LayerNorm``)."""

    def __init__(self, channels, eps=1e-5):
        super().__init__()
        self.channels, self.eps = channels, eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        x = x.transpose(1, -1)
        x = F.layer_norm(x, (self.channels,), self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


class MultiHeadAttention(nn.Module):
    """``attentions.MultiHeadAttention`` with the relative-position window (``window_size``)."""

    def __init__(self, channels, out_channels, n_heads, p_dropout=0.0, window_size=None, heads_share=True):
        super().__init__()
        self.channels, self.out_channels, self.n_heads = channels, out_channels, n_heads
        self.window_size, self.k_channels = window_size, channels // n_heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        self.drop = nn.Dropout(p_dropout)
        if window_size is not None:
            n_heads_rel = 1 if heads_share else n_heads
            rel_stddev = self.k_channels ** -0.5
            self.emb_rel_k = nn.Parameter(torch.randn(n_heads_rel, window_size * 2 + 1, self.k_channels) * rel_stddev)
            self.emb_rel_v = nn.Parameter(torch.randn(n_heads_rel, window_size * 2 + 1, self.k_channels) * rel_stddev)

    def forward(self, x, c, attn_mask=None):
        q, k, v = self.conv_q(x), self.conv_k(c), self.conv_v(c)
        x, self.attn = self.attention(q, k, v, mask=attn_mask)
        return self.conv_o(x)

    def attention(self, query, key, value, mask=None):
        b, d, t_s, t_t = (*key.size(), query.size(2))
        query = query.view(b, self.n_heads, self.k_channels, t_t).transpose(2, 3)
        key = key.view(b, self.n_heads, self.k_channels, t_s).transpose(2, 3)
        value = value.view(b, self.n_heads, self.k_channels, t_s).transpose(2, 3)
        scores = torch.matmul(query / math.sqrt(self.k_channels), key.transpose(-2, -1))
        if self.window_size is not None:
            key_relative_embeddings = self._get_relative_embeddings(self.emb_rel_k, t_s)
            rel_logits = self._matmul_with_relative_keys(query / math.sqrt(self.k_channels), key_relative_embeddings)
            scores = scores + self._relative_position_to_absolute_position(rel_logits)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e4)
        p_attn = self.drop(F.softmax(scores, dim=-1))
        output = torch.matmul(p_attn, value)
        if self.window_size is not None:
            relative_weights = self._absolute_position_to_relative_position(p_attn)
            value_relative_embeddings = self._get_relative_embeddings(self.emb_rel_v, t_s)
            output = output + self._matmul_with_relative_values(relative_weights, value_relative_embeddings)
        output = output.transpose(2, 3).contiguous().view(b, d, t_t)
        return output, p_attn

    def _matmul_with_relative_values(self, x, y):
        return torch.matmul(x, y.unsqueeze(0))

    def _matmul_with_relative_keys(self, x, y):
        return torch.matmul(x, y.unsqueeze(0).transpose(-2, -1))

    def _get_relative_embeddings(self, relative_embeddings, length):
        # Pad first before slice to avoid using cond ops (piper's comment).
        pad_length = max(length - (self.window_size + 1), 0)
        slice_start_position = max((self.window_size + 1) - length, 0)
        slice_end_position = slice_start_position + 2 * length - 1
        if pad_length > 0:
            padded = F.pad(relative_embeddings, convert_pad_shape([[0, 0], [pad_length, pad_length], [0, 0]]))
        else:
            padded = relative_embeddings
        return padded[:, slice_start_position:slice_end_position]

    def _relative_position_to_absolute_position(self, x):
        batch, heads, length, _ = x.size()
        x = F.pad(x, convert_pad_shape([[0, 0], [0, 0], [0, 0], [0, 1]]))
        x_flat = x.view([batch, heads, length * 2 * length])
        x_flat = F.pad(x_flat, convert_pad_shape([[0, 0], [0, 0], [0, length - 1]]))
        return x_flat.view([batch, heads, length + 1, 2 * length - 1])[:, :, :length, length - 1:]

    def _absolute_position_to_relative_position(self, x):
        batch, heads, length, _ = x.size()
        x = F.pad(x, convert_pad_shape([[0, 0], [0, 0], [0, 0], [0, length - 1]]))
        x_flat = x.view([batch, heads, length ** 2 + length * (length - 1)])
        x_flat = F.pad(x_flat, convert_pad_shape([[0, 0], [0, 0], [length, 0]]))
        return x_flat.view([batch, heads, length, 2 * length])[:, :, :, 1:]


class FFN(nn.Module):
    def __init__(self, in_channels, out_channels, filter_channels, kernel_size, p_dropout=0.0):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, out_channels, kernel_size)
        self.drop = nn.Dropout(p_dropout)

    def forward(self, x, x_mask):
        x = torch.relu(self.conv_1(self._same_padding(x * x_mask)))
        x = self.conv_2(self._same_padding(self.drop(x) * x_mask))
        return x * x_mask

    def _same_padding(self, x):
        if self.kernel_size == 1:
            return x
        pad_l, pad_r = (self.kernel_size - 1) // 2, self.kernel_size // 2
        return F.pad(x, convert_pad_shape([[0, 0], [0, 0], [pad_l, pad_r]]))


class Encoder(nn.Module):
    """``attentions.Encoder``: post-norm transformer layers over channels-first ``[b, h, t]``."""

    def __init__(self, hidden_channels, filter_channels, n_heads, n_layers, kernel_size=1, p_dropout=0.0,
                 window_size=4):
        super().__init__()
        self.n_layers = n_layers
        self.drop = nn.Dropout(p_dropout)
        self.attn_layers = nn.ModuleList(MultiHeadAttention(hidden_channels, hidden_channels, n_heads, p_dropout,
                                                            window_size) for _ in range(n_layers))
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FFN(hidden_channels, hidden_channels, filter_channels, kernel_size, p_dropout)
                                        for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hidden_channels) for _ in range(n_layers))

    def forward(self, x, x_mask):
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)
        x = x * x_mask
        for i in range(self.n_layers):
            y = self.drop(self.attn_layers[i](x, x, attn_mask))
            x = self.norm_layers_1[i](x + y)
            y = self.drop(self.ffn_layers[i](x, x_mask))
            x = self.norm_layers_2[i](x + y)
        return x * x_mask


class TextEncoder(nn.Module):
    def __init__(self, n_vocab, out_channels, hidden_channels, filter_channels, n_heads, n_layers, kernel_size,
                 p_dropout):
        super().__init__()
        self.out_channels, self.hidden_channels = out_channels, hidden_channels
        self.emb = nn.Embedding(n_vocab, hidden_channels)
        nn.init.normal_(self.emb.weight, 0.0, hidden_channels ** -0.5)
        self.encoder = Encoder(hidden_channels, filter_channels, n_heads, n_layers, kernel_size, p_dropout)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, x, x_lengths):
        x = self.emb(x) * math.sqrt(self.hidden_channels)  # [b, t, h]
        x = torch.transpose(x, 1, -1)  # [b, h, t]
        x_mask = torch.unsqueeze(sequence_mask(x_lengths, x.size(2)), 1).type_as(x)
        x = self.encoder(x * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs, x_mask


class WN(nn.Module):
    """WaveNet-like gated dilated convolutions (``modules.WN``), conditioned on the speaker when ``gin_channels``."""

    def __init__(self, hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=0, p_dropout=0):
        super().__init__()
        self.hidden_channels, self.n_layers = hidden_channels, n_layers
        self.in_layers, self.res_skip_layers = nn.ModuleList(), nn.ModuleList()
        self.drop = nn.Dropout(p_dropout)
        if gin_channels != 0:
            self.cond_layer = nn.Conv1d(gin_channels, 2 * hidden_channels * n_layers, 1)
        for i in range(n_layers):
            dilation = dilation_rate ** i
            padding = int((kernel_size * dilation - dilation) / 2)
            self.in_layers.append(nn.Conv1d(hidden_channels, 2 * hidden_channels, kernel_size, dilation=dilation,
                                            padding=padding))
            res_skip_channels = 2 * hidden_channels if i < n_layers - 1 else hidden_channels
            self.res_skip_layers.append(nn.Conv1d(hidden_channels, res_skip_channels, 1))

    def forward(self, x, x_mask, g=None):
        output = torch.zeros_like(x)
        n_channels_tensor = torch.IntTensor([self.hidden_channels])
        if g is not None:
            g = self.cond_layer(g)
        for i in range(self.n_layers):
            x_in = self.in_layers[i](x)
            if g is not None:
                cond_offset = i * 2 * self.hidden_channels
                g_l = g[:, cond_offset:cond_offset + 2 * self.hidden_channels, :]
            else:
                g_l = torch.zeros_like(x_in)
            acts = self.drop(fused_add_tanh_sigmoid_multiply(x_in, g_l, n_channels_tensor))
            res_skip_acts = self.res_skip_layers[i](acts)
            if i < self.n_layers - 1:
                x = (x + res_skip_acts[:, :self.hidden_channels, :]) * x_mask
                output = output + res_skip_acts[:, self.hidden_channels:, :]
            else:
                output = output + res_skip_acts
        return output * x_mask


class ResidualCouplingLayer(nn.Module):
    def __init__(self, channels, hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=0,
                 mean_only=False):
        super().__init__()
        self.half_channels, self.mean_only = channels // 2, mean_only
        self.pre = nn.Conv1d(self.half_channels, hidden_channels, 1)
        self.enc = WN(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half_channels * (2 - mean_only), 1)
        self.post.weight.data.zero_()
        self.post.bias.data.zero_()

    def forward(self, x, x_mask, g=None, reverse=False):
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.enc(self.pre(x0) * x_mask, x_mask, g=g)
        stats = self.post(h) * x_mask
        if not self.mean_only:
            m, logs = torch.split(stats, [self.half_channels] * 2, 1)
        else:
            m, logs = stats, torch.zeros_like(stats)
        if not reverse:
            x1 = m + x1 * torch.exp(logs) * x_mask
            return torch.cat([x0, x1], 1), torch.sum(logs, [1, 2])
        x1 = (x1 - m) * torch.exp(-logs) * x_mask
        return torch.cat([x0, x1], 1)


class Flip(nn.Module):
    def forward(self, x, *args, reverse=False, **kwargs):
        x = torch.flip(x, [1])
        if not reverse:
            return x, torch.zeros(x.size(0)).to(dtype=x.dtype, device=x.device)
        return x


class ResidualCouplingBlock(nn.Module):
    def __init__(self, channels, hidden_channels, kernel_size, dilation_rate, n_layers, n_flows=4, gin_channels=0):
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.append(ResidualCouplingLayer(channels, hidden_channels, kernel_size, dilation_rate, n_layers,
                                                    gin_channels=gin_channels, mean_only=True))
            self.flows.append(Flip())

    def forward(self, x, x_mask, g=None, reverse=False):
        if not reverse:
            for flow in self.flows:
                x, _ = flow(x, x_mask, g=g, reverse=reverse)
        else:
            for flow in reversed(self.flows):
                x = flow(x, x_mask, g=g, reverse=reverse)
        return x


class PosteriorEncoder(nn.Module):
    """The linear spectrogram's encoder: used in training only (``infer`` never calls it)."""

    def __init__(self, in_channels, out_channels, hidden_channels, kernel_size, dilation_rate, n_layers,
                 gin_channels=0):
        super().__init__()
        self.out_channels = out_channels
        self.pre = nn.Conv1d(in_channels, hidden_channels, 1)
        self.enc = WN(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels=gin_channels)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, x, x_lengths, g=None):
        x_mask = torch.unsqueeze(sequence_mask(x_lengths, x.size(2)), 1).to(x.dtype)
        stats = self.proj(self.enc(self.pre(x) * x_mask, x_mask, g=g)) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        z = (m + torch.randn_like(m) * torch.exp(logs)) * x_mask
        return z, m, logs, x_mask


class DurationPredictor(nn.Module):
    def __init__(self, in_channels, filter_channels, kernel_size, p_dropout, gin_channels=0):
        super().__init__()
        self.drop = nn.Dropout(p_dropout)
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_2 = LayerNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)
        if gin_channels != 0:
            self.cond = nn.Conv1d(gin_channels, in_channels, 1)

    def forward(self, x, x_mask, g=None):
        x = torch.detach(x)
        if g is not None:
            x = x + self.cond(torch.detach(g))
        x = self.drop(self.norm_1(torch.relu(self.conv_1(x * x_mask))))
        x = self.drop(self.norm_2(torch.relu(self.conv_2(x * x_mask))))
        return self.proj(x * x_mask) * x_mask


class ResBlock2(nn.Module):
    def __init__(self, channels, kernel_size=3, dilation=(1, 3)):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(channels, channels, kernel_size, 1, dilation=d,
                                             padding=get_padding(kernel_size, d)) for d in dilation)

    def forward(self, x, x_mask=None):
        for c in self.convs:
            xt = F.leaky_relu(x, LRELU_SLOPE)
            if x_mask is not None:
                xt = xt * x_mask
            x = c(xt) + x
        return x if x_mask is None else x * x_mask


class Generator(nn.Module):
    """The HiFi-GAN decoder (``models.Generator``): ``[b, c, frames] -> [b, 1, frames * prod(upsample_rates)]``."""

    def __init__(self, initial_channel, resblock_kernel_sizes, resblock_dilation_sizes, upsample_rates,
                 upsample_initial_channel, upsample_kernel_sizes, gin_channels=0):
        super().__init__()
        self.num_kernels, self.num_upsamples = len(resblock_kernel_sizes), len(upsample_rates)
        self.conv_pre = nn.Conv1d(initial_channel, upsample_initial_channel, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(upsample_initial_channel // (2 ** i), upsample_initial_channel // (2 ** (i + 1)), k, u,
                               padding=(k - u) // 2) for i, (u, k) in enumerate(zip(upsample_rates,
                                                                                     upsample_kernel_sizes)))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = upsample_initial_channel // (2 ** (i + 1))
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(ResBlock2(ch, k, d))
        self.conv_post = nn.Conv1d(ch, 1, 7, 1, padding=3, bias=False)
        if gin_channels != 0:
            self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)

    def forward(self, x, g=None):
        x = self.conv_pre(x)
        if g is not None:
            x = x + self.cond(g)
        for i in range(self.num_upsamples):
            x = self.ups[i](F.leaky_relu(x, LRELU_SLOPE))
            xs = None
            for j in range(self.num_kernels):
                block = self.resblocks[i * self.num_kernels + j](x)
                xs = block if xs is None else xs + block
            x = xs / self.num_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))


class SynthesizerTrn(nn.Module):
    """The VITS generator (``models.SynthesizerTrn``) with the deterministic duration predictor. piper fixes
    ``flow_layers`` 4, ``n_flows`` 4, ``posterior_layers`` 16 and ``dp_filter_channels`` 256; the defaults here
    are smaller (with piper's numbers the state dict loads into piper's own class, see the module docstring)."""

    def __init__(self, n_vocab, spec_channels=17, inter_channels=16, hidden_channels=32, filter_channels=64,
                 n_heads=2, n_layers=2, kernel_size=3, p_dropout=0.1, upsample_rates=(4, 4),
                 upsample_initial_channel=32, upsample_kernel_sizes=(8, 8), resblock_kernel_sizes=(3,),
                 resblock_dilation_sizes=((1, 3),), n_speakers=1, gin_channels=0, flow_layers=2, n_flows=2,
                 posterior_layers=4, dp_filter_channels=None):
        super().__init__()
        self.n_vocab, self.n_speakers = n_vocab, n_speakers
        self.hop_length = int(math.prod(upsample_rates))
        self.enc_p = TextEncoder(n_vocab, inter_channels, hidden_channels, filter_channels, n_heads, n_layers,
                                 kernel_size, p_dropout)
        self.dec = Generator(inter_channels, resblock_kernel_sizes, resblock_dilation_sizes, upsample_rates,
                             upsample_initial_channel, upsample_kernel_sizes, gin_channels=gin_channels)
        self.enc_q = PosteriorEncoder(spec_channels, inter_channels, hidden_channels, 5, 1, posterior_layers,
                                      gin_channels)
        self.flow = ResidualCouplingBlock(inter_channels, hidden_channels, 5, 1, flow_layers, n_flows=n_flows,
                                          gin_channels=gin_channels)
        self.dp = DurationPredictor(hidden_channels, dp_filter_channels or filter_channels, 3, 0.5,
                                    gin_channels=gin_channels)
        if n_speakers > 1:
            self.emb_g = nn.Embedding(n_speakers, gin_channels)

    def infer(self, x, x_lengths, sid=None, noise_scale=1.0, length_scale=1.0, noise_scale_w=1.0, max_len=None):
        x, m_p, logs_p, x_mask = self.enc_p(x, x_lengths)
        g = self.emb_g(sid).unsqueeze(-1) if self.n_speakers > 1 else None  # [b, h, 1]
        logw = self.dp(x, x_mask, g=g)
        w = torch.exp(logw) * x_mask * length_scale
        w_ceil = torch.ceil(w)
        y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()
        y_mask = torch.unsqueeze(sequence_mask(y_lengths, None), 1).type_as(x_mask)
        attn_mask = torch.unsqueeze(x_mask, 2) * torch.unsqueeze(y_mask, -1)
        attn = generate_path(w_ceil, attn_mask)
        m_p = torch.matmul(attn.squeeze(1), m_p.transpose(1, 2)).transpose(1, 2)
        logs_p = torch.matmul(attn.squeeze(1), logs_p.transpose(1, 2)).transpose(1, 2)
        z_p = m_p + torch.randn_like(m_p) * torch.exp(logs_p) * noise_scale
        z = self.flow(z_p, y_mask, g=g, reverse=True)
        o = self.dec((z * y_mask)[:, :, :max_len], g=g)
        return o, attn, y_mask, (z, z_p, m_p, logs_p)


def spread(model: nn.Module, seed: int, duration_bias: float = 1.0) -> nn.Module:
    """Random weights everywhere (the flows' zero-initialised ``post`` too, else the flow is the identity) and
    durations of a few frames per token (``dp.proj`` bias), so a synthesis has a non-trivial alignment, and a
    louder output layer, so a tolerance in audio units means something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("post.weight") or name.endswith("post.bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        model.dp.proj.bias.fill_(duration_bias)
        model.dec.conv_post.weight.mul_(8.0)  # audio peaks near 0.3 instead of 0.04
    return model


def tiny_vits(n_vocab: int, n_speakers: int = 1, seed: int = 0, **sizes) -> SynthesizerTrn:
    """A small piper-structured voice in eval mode (``gin_channels`` 8 when multi-speaker)."""
    torch.manual_seed(seed)
    model = SynthesizerTrn(n_vocab, n_speakers=n_speakers, gin_channels=8 if n_speakers > 1 else 0, **sizes)
    return spread(model, seed).eval()


#: piper's symbol table layout (``phoneme_id_map``: pad ``_`` 0, bos ``^`` 1, eos ``$`` 2, space 3, punctuation,
#: then phonemes), cut to a few IPA symbols.
PIPER_SYMBOLS = ["_", "^", "$", " ", "!", ",", ".", "?", "a", "b", "d", "e", "h", "i", "k", "l", "m", "n", "o",
                 "p", "s", "t", "u", "w", "ð", "ə", "ɛ", "ɪ", "ɹ", "ʊ"]
LEXICON = {"hello": "hɛloʊ", "world": "wɜld", "this": "ðɪs", "is": "ɪz", "a": "ə", "test": "tɛst",
           "the": "ðə", "speech": "spit", "model": "mɑdəl", "speaks": "spiks", "in": "ɪn", "sherpa": "ʃɛɹpə",
           "onnx": "ɑnəks", "too": "tu", "bird": "bɜd", "sings": "sɪŋz"}


def tiny_voice():
    """``(tokens, lexicon)``: piper's symbol layout and a lexicon spelled with its symbols (a symbol a word needs
    and the table lacks is replaced by a close one)."""
    tokens = {s: i for i, s in enumerate(PIPER_SYMBOLS)}
    near = {"ɜ": "ə", "ɑ": "a", "ʃ": "s", "ŋ": "n", "z": "s"}
    lexicon = {w: [near.get(c, c) for c in spelled] for w, spelled in LEXICON.items()}
    return tokens, lexicon
