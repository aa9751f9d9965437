"""Small FunASR models written as FunASR writes them: SenseVoiceSmall (SAN-M encoder, CTC head) and Paraformer.

The modules copy FunASR's (modelscope/FunASR 1.4.16, ``funasr/models/sense_voice/model.py``,
``funasr/models/sanm/``, ``funasr/models/paraformer/``): the same classes, attribute names and arithmetic, so a
FunASR checkpoint's ``state_dict`` loads into them and the other way round (checked against the real classes in a
scratch environment: the outputs were equal). Only inference is kept (no training losses, no streaming chunks).
FunASR ships beside the weights a ``config.yaml`` whose ``frontend_conf`` holds the front end (``lfr_m``,
``lfr_n``, ``n_mels``, ``window``, ``dither`` ...), an ``am.mvn`` Kaldi nnet text file (the CMVN: ``<AddShift>``
then ``<Rescale>``) and the tokens (SenseVoice: a SentencePiece model; Paraformer: ``tokens.json``):
``frontend_conf``, ``write_am_mvn`` and the ``*_tokens`` functions make those for the small models here.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import torch
from torch import nn

# FunASR's SenseVoiceSmall.__init__ (hard-coded there): the language and text-norm ids of its embedding
LID_DICT = {"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}
TEXTNORM_DICT = {"withitn": 14, "woitn": 15}


def sequence_mask(lengths: torch.Tensor, maxlen: int) -> torch.Tensor:
    """FunASR's ``sequence_mask``: ``[B, maxlen]`` float, 1 on each item's first ``lengths`` frames."""
    row = torch.arange(0, maxlen, 1).to(lengths.device)
    return (row < lengths.unsqueeze(-1)).float()


class SinusoidalPositionEncoder(nn.Module):
    """FunASR's: adds sin/cos of positions 1..T (not 0..T-1), the timescale step ``log(10000) / (depth/2 - 1)``."""

    def encode(self, positions: torch.Tensor, depth: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        positions = positions.type(dtype)
        step = math.log(10000.0) / (depth / 2 - 1)
        inv = torch.exp(torch.arange(depth // 2, device=positions.device).type(dtype) * -step)
        scaled = positions.reshape(1, -1, 1) * inv.reshape(1, 1, -1)
        return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=2).type(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(1, x.size(1) + 1, device=x.device)[None, :]
        return x + self.encode(positions, x.size(2), x.dtype)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, idim: int, hidden_units: int, dropout_rate: float = 0.0):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.w_2 = nn.Linear(hidden_units, idim)
        self.dropout = nn.Dropout(dropout_rate)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class MultiHeadedAttentionSANM(nn.Module):
    """Self-attention plus an FSMN memory (a depthwise convolution over the masked values): FunASR's SAN-M."""

    def __init__(self, n_head: int, in_feat: int, n_feat: int, dropout_rate: float, kernel_size: int,
                 sanm_shfit: int = 0):
        super().__init__()
        self.d_k, self.h = n_feat // n_head, n_head
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_q_k_v = nn.Linear(in_feat, n_feat * 3)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.fsmn_block = nn.Conv1d(n_feat, n_feat, kernel_size, stride=1, padding=0, groups=n_feat, bias=False)
        left = (kernel_size - 1) // 2 + max(sanm_shfit, 0)
        self.pad_fn = nn.ConstantPad1d((left, kernel_size - 1 - left), 0.0)

    def forward_fsmn(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b = inputs.size(0)
        mask = torch.reshape(mask, (b, -1, 1))
        inputs = inputs * mask
        x = self.fsmn_block(self.pad_fn(inputs.transpose(1, 2))).transpose(1, 2)
        return self.dropout(x + inputs) * mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.size()
        q, k, v = torch.split(self.linear_q_k_v(x), self.h * self.d_k, dim=-1)
        q_h, k_h, v_h = (torch.reshape(z, (b, t, self.h, self.d_k)).transpose(1, 2) for z in (q, k, v))
        fsmn_memory = self.forward_fsmn(v, mask)
        scores = torch.matmul(q_h * self.d_k ** (-0.5), k_h.transpose(-2, -1))
        masked = mask.unsqueeze(1).eq(0)  # [B, 1, 1, T]: padded keys
        attn = torch.softmax(scores.masked_fill(masked, -float("inf")), dim=-1).masked_fill(masked, 0.0)
        out = torch.matmul(self.dropout(attn), v_h).transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linear_out(out) + fsmn_memory


class EncoderLayerSANM(nn.Module):
    """Pre-norm SAN-M layer; the residual only where the input and output widths agree (FunASR's first layer)."""

    def __init__(self, in_size: int, size: int, self_attn: nn.Module, feed_forward: nn.Module,
                 dropout_rate: float = 0.0):
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.norm1, self.norm2 = nn.LayerNorm(in_size), nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout_rate)
        self.in_size, self.size = in_size, size

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        attended = self.dropout(self.self_attn(self.norm1(x), mask))
        x = x + attended if self.in_size == self.size else attended
        return x + self.dropout(self.feed_forward(self.norm2(x))), mask


def _sanm_layers(count: int, in_size: int, size: int, heads: int, units: int, kernel: int) -> nn.ModuleList:
    return nn.ModuleList(EncoderLayerSANM(in_size, size, MultiHeadedAttentionSANM(heads, in_size, size, 0.0, kernel),
                                          PositionwiseFeedForward(size, units)) for _ in range(count))


class SenseVoiceEncoderSmall(nn.Module):
    """FunASR's SenseVoice encoder: inputs scaled by sqrt(width), positions added, one layer from the input width
    (``encoders0``), ``num_blocks - 1`` more, ``after_norm``, ``tp_blocks`` more, ``tp_norm``."""

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4, linear_units: int = 2048,
                 num_blocks: int = 6, tp_blocks: int = 0, kernel_size: int = 11):
        super().__init__()
        self._output_size = output_size
        self.embed = SinusoidalPositionEncoder()
        self.encoders0 = _sanm_layers(1, input_size, output_size, attention_heads, linear_units, kernel_size)
        self.encoders = _sanm_layers(num_blocks - 1, output_size, output_size, attention_heads, linear_units,
                                     kernel_size)
        self.tp_encoders = _sanm_layers(tp_blocks, output_size, output_size, attention_heads, linear_units,
                                        kernel_size)
        self.after_norm, self.tp_norm = nn.LayerNorm(output_size), nn.LayerNorm(output_size)

    def output_size(self) -> int:
        return self._output_size

    def forward(self, xs_pad: torch.Tensor, ilens: torch.Tensor):
        masks = sequence_mask(ilens, xs_pad.shape[1])[:, None, :]
        xs_pad = self.embed(xs_pad * self.output_size() ** 0.5)
        for layer in list(self.encoders0) + list(self.encoders):
            xs_pad, masks = layer(xs_pad, masks)
        xs_pad = self.after_norm(xs_pad)
        olens = masks.squeeze(1).sum(1).int()
        for layer in self.tp_encoders:
            xs_pad, masks = layer(xs_pad, masks)
        return self.tp_norm(xs_pad), olens


class CTC(nn.Module):
    """FunASR's CTC head: ``ctc_lo`` is the output layer (its ``log_softmax`` is taken in decoding)."""

    def __init__(self, odim: int, encoder_output_size: int):
        super().__init__()
        self.ctc_lo = nn.Linear(encoder_output_size, odim)

    def log_softmax(self, hs_pad: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.ctc_lo(hs_pad), dim=2)


class SenseVoiceSmall(nn.Module):
    """FunASR's SenseVoiceSmall for inference: ``embed`` holds the 4 prefix queries (language, event 1, emotion 2,
    text norm), ``encoder``, ``ctc``; ``lid_dict`` / ``textnorm_dict`` the ids of the queries. ``forward`` is
    FunASR's ``export_forward`` (``sense_voice/export_meta.py``): the queries prepended, lengths + 4, the CTC
    output layer's logits and the encoder's lengths."""

    def __init__(self, input_size: int = 560, vocab_size: int = 48, encoder_conf: Dict[str, int] = None,
                 blank_id: int = 0, lid_dict: Dict[str, int] = None, textnorm_dict: Dict[str, int] = None):
        super().__init__()
        self.encoder = SenseVoiceEncoderSmall(input_size=input_size, **(encoder_conf or {}))
        self.ctc = CTC(vocab_size, self.encoder.output_size())
        self.blank_id, self.vocab_size = blank_id, vocab_size
        self.lid_dict = dict(LID_DICT if lid_dict is None else lid_dict)
        self.textnorm_dict = dict(TEXTNORM_DICT if textnorm_dict is None else textnorm_dict)
        self.embed = nn.Embedding(7 + len(self.lid_dict) + len(self.textnorm_dict), input_size)

    def forward(self, speech: torch.Tensor, speech_lengths: torch.Tensor, language: torch.Tensor,
                textnorm: torch.Tensor):
        language_query = self.embed(language.long()).unsqueeze(1)
        textnorm_query = self.embed(textnorm.long()).unsqueeze(1)
        speech = torch.cat((textnorm_query, speech), dim=1)
        event_emo_query = self.embed(torch.tensor([[1, 2]], device=speech.device)).repeat(speech.size(0), 1, 1)
        speech = torch.cat((torch.cat((language_query, event_emo_query), dim=1), speech), dim=1)
        encoder_out, encoder_out_lens = self.encoder(speech, speech_lengths + 4)
        return self.ctc.ctc_lo(encoder_out), encoder_out_lens


def _lively(linear: nn.Linear, blank: int, seed: int, scale: float = 1.5) -> None:
    """Weights that make a random CTC head say something: the blank's bias lowered, larger output weights (so an
    untrained model's greedy decode has several different tokens per utterance, and the comparison compares)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * scale / math.sqrt(linear.in_features))
        linear.bias.zero_()
        linear.bias[blank] = -2.0


def sense_voice_small(vocab_size: int = 48, n_mels: int = 80, lfr_m: int = 7, seed: int = 0,
                      lid_dict: Dict[str, int] = None) -> SenseVoiceSmall:
    """A small SenseVoiceSmall (width 32, 2 + 1 SAN-M layers, FSMN kernel 5), in eval mode."""
    torch.manual_seed(seed)
    model = SenseVoiceSmall(n_mels * lfr_m, vocab_size, dict(output_size=32, attention_heads=2, linear_units=48,
                                                             num_blocks=2, tp_blocks=1, kernel_size=5),
                            lid_dict=lid_dict)
    _lively(model.ctc.ctc_lo, model.blank_id, seed)
    return model.eval()


def frontend_conf(lfr_m: int = 7, lfr_n: int = 6, n_mels: int = 80, **changes) -> Dict[str, object]:
    """``config.yaml``'s ``frontend: WavFrontend`` settings as FunASR's SenseVoiceSmall and Paraformer ship them
    (``dither`` is FunASR's default 1.0: sherpa-onnx uses 0)."""
    return {"fs": 16000, "window": "hamming", "n_mels": n_mels, "frame_length": 25, "frame_shift": 10,
            "lfr_m": lfr_m, "lfr_n": lfr_n, "dither": 1.0, "snip_edges": True, "upsacle_samples": True,
            "cmvn_file": "am.mvn", **changes}


def cmvn_stats(dim: int, seed: int = 0):
    """A plausible global CMVN for log-mel features: the AddShift (minus a mean around 10) and the Rescale (one
    over a standard deviation around 3), ``dim`` values each."""
    g = torch.Generator().manual_seed(seed)
    neg_mean = -(10.0 + 2.0 * torch.rand(dim, generator=g))
    inv_stddev = 1.0 / (2.5 + torch.rand(dim, generator=g))
    return neg_mean.tolist(), inv_stddev.tolist()


def write_am_mvn(path: str, neg_mean: Sequence[float], inv_stddev: Sequence[float]) -> str:
    """An ``am.mvn`` as FunASR ships it: a Kaldi nnet1 text file, ``<AddShift>`` (the negative means) then
    ``<Rescale>`` (the inverse standard deviations), each vector on a ``<LearnRateCoef> 0 [ ... ]`` line."""
    def vector(values):
        return "<LearnRateCoef> 0 [ " + " ".join(f"{v:.8g}" for v in values) + " ]\n"
    text = (f"<Nnet>\n<Splice> {len(neg_mean)} {len(neg_mean)}\n[ 0 ]\n"
            f"<AddShift> {len(neg_mean)} {len(neg_mean)}\n" + vector(neg_mean) +
            f"<Rescale> {len(inv_stddev)} {len(inv_stddev)}\n" + vector(inv_stddev) + "</Nnet>\n")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def sense_voice_tokens(vocab_size: int = 48) -> List[str]:
    """SentencePiece pieces in id order as SenseVoice's tokenizer has them: ``<unk>``, ``<s>``, ``</s>``, the
    tags, then word pieces (``▁`` marks a word start; some CJK)."""
    tags = ["<|zh|>", "<|en|>", "<|yue|>", "<|ja|>", "<|ko|>", "<|nospeech|>", "<|withitn|>", "<|woitn|>",
            "<|HAPPY|>", "<|Speech|>"]
    words = ["▁the", "▁a", "s", "ing", "▁to", "ed", "▁of", "er", "▁and", "ly", "你", "好", "的", "是", "▁in", "re",
             "▁is", "t", "on", "▁it", "al", "▁we", "ar", "en", "▁be", "or", "le", "▁that", "an", "ch", "ou", "st",
             "▁you", "ve", "▁for", "it", "ic", "ir"]
    pieces = ["<unk>", "<s>", "</s>"] + tags + words
    if vocab_size > len(pieces):
        pieces += [f"▁w{i}" for i in range(vocab_size - len(pieces))]
    return pieces[:vocab_size]


# ---------------------------------------------------------------------------------------------------------------
# Paraformer: SAN-M encoder, CIF predictor, SAN-M decoder (funasr/models/paraformer/{model,cif_predictor,decoder}.py)


class SANMEncoder(SenseVoiceEncoderSmall):
    """FunASR's ``SANMEncoder`` with ``input_layer: pe`` (Paraformer's): SenseVoice's encoder without the
    ``tp_*`` layers."""

    def __init__(self, input_size: int, output_size: int = 256, attention_heads: int = 4, linear_units: int = 2048,
                 num_blocks: int = 6, kernel_size: int = 11):
        super().__init__(input_size, output_size, attention_heads, linear_units, num_blocks, 0, kernel_size)
        del self.tp_encoders, self.tp_norm

    def forward(self, xs_pad: torch.Tensor, ilens: torch.Tensor):
        masks = sequence_mask(ilens, xs_pad.shape[1])[:, None, :]
        xs_pad = self.embed(xs_pad * self.output_size() ** 0.5)
        for layer in list(self.encoders0) + list(self.encoders):
            xs_pad, masks = layer(xs_pad, masks)
        return self.after_norm(xs_pad), masks.squeeze(1).sum(1).int(), None


def cif_v1(hidden: torch.Tensor, alphas: torch.Tensor, threshold: float = 1.0):
    """FunASR's ``cif_v1_export`` (continuous integrate-and-fire; threshold 1): a token fires where the running sum
    of ``alphas`` crosses an integer; its embedding is the alpha-weighted sum of the frames since the last one.
    Boolean indexing: the number of tokens depends on the data (eager only: the graph uses ``cif_weights``)."""
    batch, frames, width = hidden.size()
    prefix_sum = torch.cumsum(alphas, dim=1, dtype=torch.float64).to(torch.float32)
    prefix_sum_floor = torch.floor(prefix_sum)
    dislocation_floor = torch.floor(torch.roll(prefix_sum, 1, dims=1))
    dislocation_floor[:, 0] = 0
    fire_idxs = (prefix_sum_floor - dislocation_floor) > 0
    fires = torch.zeros(batch, frames, dtype=hidden.dtype)
    fires[fire_idxs] = 1
    fires = fires + prefix_sum - prefix_sum_floor
    max_label_len = int(torch.floor(alphas.sum(dim=-1)).max())
    if int(fire_idxs.sum()) == 0:
        return torch.zeros(batch, max_label_len, width, dtype=hidden.dtype), fires
    prefix_sum_hidden = torch.cumsum(alphas.unsqueeze(-1).repeat((1, 1, width)) * hidden, dim=1)
    fired = prefix_sum_hidden[fire_idxs]
    shift_frames = torch.roll(fired, 1, dims=0)
    batch_len = fire_idxs.sum(1)
    shift_batch_idxs = torch.roll(torch.cumsum(batch_len, dim=0), 1, dims=0)
    shift_batch_idxs[0] = 0
    shift_frames[shift_batch_idxs] = 0
    remains = fires - torch.floor(fires)
    remain_frames = remains[fire_idxs].unsqueeze(-1).repeat((1, width)) * hidden[fire_idxs]
    shift_remain_frames = torch.roll(remain_frames, 1, dims=0)
    shift_remain_frames[shift_batch_idxs] = 0
    fired = fired - shift_frames + shift_remain_frames - remain_frames
    frame_fires = torch.zeros(batch, max_label_len, width, dtype=hidden.dtype)
    keep = torch.arange(max_label_len).expand(batch, -1) < batch_len.unsqueeze(1)
    frame_fires[keep] = fired
    return frame_fires, fires


class CifPredictorV2(nn.Module):
    """FunASR's CIF predictor: a convolution over the encoder output gives one weight (alpha) per frame; the
    ``tail_threshold`` is added one frame past each item's end (so the tail fires the last token, ``</s>``)."""

    def __init__(self, idim: int, l_order: int = 1, r_order: int = 1, threshold: float = 1.0,
                 smooth_factor: float = 1.0, noise_threshold: float = 0.0, tail_threshold: float = 0.45):
        super().__init__()
        self.pad = nn.ConstantPad1d((l_order, r_order), 0)
        self.cif_conv1d = nn.Conv1d(idim, idim, l_order + r_order + 1)
        self.cif_output = nn.Linear(idim, 1)
        self.threshold, self.smooth_factor = threshold, smooth_factor
        self.noise_threshold, self.tail_threshold = noise_threshold, tail_threshold

    def alphas(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[B, T + 1]``: the masked alphas with the tail threshold one frame past each item's end."""
        output = torch.relu(self.cif_conv1d(self.pad(hidden.transpose(1, 2)))).transpose(1, 2)
        alphas = torch.sigmoid(self.cif_output(output))
        alphas = torch.relu(alphas * self.smooth_factor - self.noise_threshold) * mask.transpose(-1, -2).float()
        alphas, mask = alphas.squeeze(-1), mask.float().squeeze(1)
        zeros = torch.zeros((alphas.size(0), 1), dtype=torch.float32)
        tail = (torch.cat([torch.ones_like(zeros), mask], 1) - torch.cat([mask, zeros], 1)) * self.tail_threshold
        return torch.cat([alphas, zeros], 1) + tail

    def forward(self, hidden: torch.Tensor, target_label=None, mask: torch.Tensor = None):
        """Inference (``target_label`` None, as FunASR's decode calls it): ``(embeddings [B, U, D], token_num
        (floored), alphas, fires)``, ``U`` the largest ``token_num``."""
        alphas = self.alphas(hidden, mask)
        hidden = torch.cat([hidden, torch.zeros((hidden.size(0), 1, hidden.size(2)), dtype=hidden.dtype)], 1)
        acoustic_embeds, cif_peak = cif_v1(hidden, alphas, self.threshold)
        return acoustic_embeds, torch.floor(alphas.sum(-1)), alphas, cif_peak


class MultiHeadedAttentionSANMDecoder(nn.Module):
    """The decoder's self-attention: an FSMN memory only (a depthwise convolution over the masked inputs)."""

    def __init__(self, n_feat: int, dropout_rate: float, kernel_size: int, sanm_shfit: int = 0):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout_rate)
        self.fsmn_block = nn.Conv1d(n_feat, n_feat, kernel_size, stride=1, padding=0, groups=n_feat, bias=False)
        left = (kernel_size - 1) // 2 + max(sanm_shfit, 0)
        self.pad_fn = nn.ConstantPad1d((left, kernel_size - 1 - left), 0.0)
        self.kernel_size = kernel_size

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor):
        mask = torch.reshape(mask, (inputs.size(0), -1, 1))
        inputs = inputs * mask
        x = self.fsmn_block(self.pad_fn(inputs.transpose(1, 2))).transpose(1, 2)
        return self.dropout(x + inputs) * mask, None


class MultiHeadedAttentionCrossAtt(nn.Module):
    def __init__(self, n_head: int, n_feat: int, dropout_rate: float):
        super().__init__()
        self.d_k, self.h = n_feat // n_head, n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k_v = nn.Linear(n_feat, n_feat * 2)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.dropout = nn.Dropout(p=dropout_rate)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        b = x.size(0)
        q_h = torch.reshape(self.linear_q(x), (b, -1, self.h, self.d_k)).transpose(1, 2)
        k, v = torch.split(self.linear_k_v(memory), self.h * self.d_k, dim=-1)
        k_h, v_h = (torch.reshape(z, (b, -1, self.h, self.d_k)).transpose(1, 2) for z in (k, v))
        scores = torch.matmul(q_h * self.d_k ** (-0.5), k_h.transpose(-2, -1))
        masked = memory_mask.unsqueeze(1).eq(0)
        attn = torch.softmax(scores.masked_fill(masked, -float("inf")), dim=-1).masked_fill(masked, 0.0)
        out = torch.matmul(self.dropout(attn), v_h).transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linear_out(out)


class PositionwiseFeedForwardDecoderSANM(nn.Module):
    def __init__(self, idim: int, hidden_units: int, dropout_rate: float = 0.0):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.w_2 = nn.Linear(hidden_units, idim, bias=False)
        self.dropout = nn.Dropout(dropout_rate)
        self.activation = nn.ReLU()
        self.norm = nn.LayerNorm(hidden_units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.norm(self.dropout(self.activation(self.w_1(x)))))


class DecoderLayerSANM(nn.Module):
    """FunASR's decoder layer: feed-forward first, then (optionally) the FSMN self-attention with a residual, then
    (optionally) cross-attention over the encoder output with a residual; the last layer is a feed-forward only."""

    def __init__(self, size: int, self_attn, src_attn, feed_forward, dropout_rate: float = 0.0):
        super().__init__()
        self.size, self.self_attn, self.src_attn, self.feed_forward = size, self_attn, src_attn, feed_forward
        self.norm1 = nn.LayerNorm(size)
        if self_attn is not None:
            self.norm2 = nn.LayerNorm(size)
        if src_attn is not None:
            self.norm3 = nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, tgt, tgt_mask, memory, memory_mask):
        residual = tgt
        tgt = self.feed_forward(self.norm1(tgt))
        x = tgt
        if self.self_attn is not None:
            x, _ = self.self_attn(self.norm2(tgt), tgt_mask)
            x = residual + self.dropout(x)
        if self.src_attn is not None:
            x = x + self.dropout(self.src_attn(self.norm3(x), memory, memory_mask))
        return x


class ParaformerSANMDecoder(nn.Module):
    """FunASR's non-autoregressive decoder over the CIF embeddings (``att_layer_num`` = ``num_blocks``: no
    ``decoders2``); ``embed`` is kept for the state dict (the decoder reads embeddings, not ids)."""

    def __init__(self, vocab_size: int, encoder_output_size: int, attention_heads: int = 4, linear_units: int = 2048,
                 num_blocks: int = 6, kernel_size: int = 21, sanm_shfit: int = 0):
        super().__init__()
        d = encoder_output_size
        self.embed = nn.Sequential(nn.Embedding(vocab_size, d))
        self.after_norm = nn.LayerNorm(d)
        self.output_layer = nn.Linear(d, vocab_size)
        self.decoders = nn.ModuleList(
            DecoderLayerSANM(d, MultiHeadedAttentionSANMDecoder(d, 0.0, kernel_size, sanm_shfit),
                             MultiHeadedAttentionCrossAtt(attention_heads, d, 0.0),
                             PositionwiseFeedForwardDecoderSANM(d, linear_units)) for _ in range(num_blocks))
        self.decoders2 = None
        self.decoders3 = nn.ModuleList([DecoderLayerSANM(d, None, None,
                                                         PositionwiseFeedForwardDecoderSANM(d, linear_units))])

    def forward(self, hs_pad, hlens, ys_in_pad, ys_in_lens):
        tgt_mask = sequence_mask(ys_in_lens, ys_in_pad.size(1))[:, :, None]
        memory_mask = sequence_mask(hlens, hs_pad.size(1))[:, None, :]
        x = ys_in_pad
        for layer in list(self.decoders) + list(self.decoders3):
            x = layer(x, tgt_mask, hs_pad, memory_mask)
        return self.output_layer(self.after_norm(x)), tgt_mask.sum(1)


class Paraformer(nn.Module):
    """FunASR's Paraformer for inference. ``forward`` is FunASR's ``export_forward``
    (``paraformer/export_meta.py``): encoder, CIF predictor (``token_num`` floored), decoder over the fired
    embeddings, ``log_softmax``; returns ``(log-probs [N, U, V], token_num int32 [N])``, ``U`` the largest
    ``token_num`` of the batch."""

    def __init__(self, input_size: int = 560, vocab_size: int = 40, encoder_conf: Dict[str, int] = None,
                 decoder_conf: Dict[str, int] = None, predictor_conf: Dict[str, float] = None,
                 sos: int = 1, eos: int = 2, blank_id: int = 0):
        super().__init__()
        self.encoder = SANMEncoder(input_size, **(encoder_conf or {}))
        width = self.encoder.output_size()
        self.predictor = CifPredictorV2(width, **(predictor_conf or {}))
        self.decoder = ParaformerSANMDecoder(vocab_size, width, **(decoder_conf or {}))
        self.sos, self.eos, self.blank_id, self.vocab_size = sos, eos, blank_id, vocab_size

    def forward(self, speech: torch.Tensor, speech_lengths: torch.Tensor):
        enc, enc_len, _ = self.encoder(speech, speech_lengths)
        mask = sequence_mask(enc_len, enc.size(1))[:, None, :]
        embeds, token_num, _, _ = self.predictor(enc, mask=mask)
        token_num = token_num.floor().type(torch.int32)
        decoder_out, _ = self.decoder(enc, enc_len, embeds, token_num)
        return torch.log_softmax(decoder_out, dim=-1), token_num


def paraformer(vocab_size: int = 40, n_mels: int = 80, lfr_m: int = 7, seed: int = 0) -> Paraformer:
    """A small Paraformer (width 32, 2 encoder and 2 + 1 decoder layers), in eval mode; the CIF's output bias set
    so about one token fires every two to three LFR frames, ``</s>`` rarely the best token."""
    torch.manual_seed(seed)
    model = Paraformer(n_mels * lfr_m, vocab_size,
                       dict(output_size=32, attention_heads=2, linear_units=48, num_blocks=2, kernel_size=5),
                       dict(attention_heads=2, linear_units=48, num_blocks=2, kernel_size=5))
    _lively(model.decoder.output_layer, model.eos, seed)
    with torch.no_grad():
        model.predictor.cif_output.bias.fill_(-0.6)
    return model.eval()


def paraformer_tokens(vocab_size: int = 40) -> List[str]:
    """FunASR's Paraformer token list (``tokens.json``): ``<blank>``, ``<s>``, ``</s>``, then characters and
    ``@@``-joined English pieces, ``<unk>`` last."""
    chars = list("我们的是在了不和有大这主中人上为地个用工时要动国产以到说生") + ["he@@", "llo", "wor@@", "ld"]
    pieces = ["<blank>", "<s>", "</s>"] + chars
    pieces = pieces[:vocab_size - 1] + [f"x{i}" for i in range(vocab_size - 1 - len(pieces))]
    return pieces + ["<unk>"]
