"""An LSTM attention decoder with accumulated attention weights, as i6 exports its AED for RASR's ``stateful-onnx``.

Laid out after i6_experiments' ``seq2seq_rasr_2025`` AED
(``model_pipelines/aed/pytorch_modules.py``, ``export.py`` @``298b03b4``;
``shared/reference/rasr_label_scorers.md`` §4.2): the encoder output
concatenates the encoder frames, the attention keys and the inverse
fertility (``E' = E + A + 1``); the decoder's five states are

- ``accum_att_weights`` ``[B, T', 1]``: the attention weights summed over
  the labels so far, scaled by the inverse fertility (RETURNN's weight
  feedback). It is sized by the encoder frames, not by the label history:
  every hypothesis of one utterance has the same ``T'``, so RASR can stack
  hypotheses on axis 0;
- ``att_context`` ``[B, E]``, ``lstm_c`` / ``lstm_h`` ``[B, H]`` (an
  ``LSTMCell``: batch first already), ``token_embedding`` ``[B, M]`` (the
  last label's, read by the scorer; the updater does not take it).

``initial_states``: the first decoder step from a zero token embedding and
a zero context (the implicit start label; RASR feeds none). ``step``: one
label in, the five states out. ``log_probs``: the readout of
``(att_context, lstm_h, token_embedding)``. The encoder is the bundled
Conformer (one block), as in ``aed.py``.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from .conformer import ConformerEncoder, _mask


class I6AED(nn.Module):
    def __init__(self, features: int = 20, vocab: int = 10, dim: int = 32, attention: int = 16, hidden: int = 32,
                 embed: int = 16, sentence_end: int = 0):
        super().__init__()
        self.vocab, self.dim, self.attention, self.hidden, self.embed = vocab, dim, attention, hidden, embed
        self.sentence_end = sentence_end
        self.encoder = ConformerEncoder(features, vocab + 1, dim=dim, layers=1, heads=4, kernel=7)
        self.keys = nn.Linear(dim, attention)
        self.fertility = nn.Linear(dim, 1)
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTMCell(embed + dim, hidden)
        self.query = nn.Linear(hidden, attention, bias=False)
        self.weight_feedback = nn.Linear(1, attention, bias=False)
        self.energy = nn.Linear(attention, 1, bias=False)
        self.readout = nn.Linear(hidden + dim + embed, vocab)

    @property
    def encoder_dim(self) -> int:
        """``E'``: the frames, the attention keys and the inverse fertility, concatenated."""
        return self.dim + self.attention + 1

    def encode(self, features: torch.Tensor, lengths: torch.Tensor):
        """``[B, T, F]``, ``[B]`` -> ``[B, T', E']`` (frames, keys, inverse fertility) and the frames' lengths."""
        x, lengths = self.encoder.subsampling(features, lengths)
        mask = _mask(x, lengths)
        for block in self.encoder.blocks:
            x = block(x, mask)
        return torch.cat([x, self.keys(x), torch.sigmoid(self.fertility(x))], -1), lengths

    def _split(self, enc: torch.Tensor):
        return enc[..., :self.dim], enc[..., self.dim:self.dim + self.attention], enc[..., -1:]

    def _decoder_step(self, embedding, enc, lengths, accum, context, c, h):
        """The LSTM on the last label's embedding and context, then attention with weight feedback: the new
        ``(accum_att_weights, att_context, lstm_c, lstm_h)``."""
        h, c = self.lstm(torch.cat([embedding, context], -1), (h, c))
        values, keys, inv_fertility = self._split(enc)
        energies = self.energy(torch.tanh(keys + self.query(h)[:, None] + self.weight_feedback(accum)))[..., 0]
        weights = energies.masked_fill(~_mask(enc, lengths), float("-inf")).softmax(-1)  # [B, T']
        context = torch.einsum("bt,bte->be", weights, values)
        return accum + 0.5 * inv_fertility * weights[..., None], context, c, h

    def initial_states(self, enc: torch.Tensor, lengths: torch.Tensor):
        """The decoder after the implicit start label: ``(accum_att_weights [B, T', 1], att_context, lstm_c,
        lstm_h, token_embedding)``, from zeros (i6's ``AEDStateInitializer``)."""
        batch = enc.shape[0]
        zeros = enc.new_zeros(batch, self.hidden)
        embedding = enc.new_zeros(batch, self.embed)
        accum = enc.new_zeros(batch, enc.shape[1], 1)
        return self._decoder_step(embedding, enc, lengths, accum, enc.new_zeros(batch, self.dim), zeros,
                                  zeros) + (embedding,)

    def step(self, token: torch.Tensor, enc: torch.Tensor, lengths: torch.Tensor, accum: torch.Tensor,
             context: torch.Tensor, c: torch.Tensor, h: torch.Tensor):
        """One label ``[B]`` in: the five states (i6's ``AEDStateUpdater``; it does not read the last
        ``token_embedding``)."""
        embedding = self.embedding(token.long())
        return self._decoder_step(embedding, enc, lengths, accum, context, c, h) + (embedding,)

    def log_probs(self, context: torch.Tensor, h: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The next label's log-probs ``[B, V]`` (i6's ``AEDScorer`` returns their negation)."""
        return self.readout(torch.cat([h, context, embedding], -1)).log_softmax(-1)

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, max_labels: int = None) -> List[int]:
        """Labels of one utterance ``[1, T, F]`` until ``sentence_end`` (left out) or ``max_labels`` (default
        twice the encoder frames)."""
        enc, lengths = self.encode(features, torch.tensor([features.shape[1]], dtype=torch.int32))
        accum, context, c, h, embedding = self.initial_states(enc, lengths)
        labels: List[int] = []
        for _ in range(max_labels if max_labels is not None else 2 * enc.shape[1]):
            best = int(self.log_probs(context, h, embedding).argmax(-1))
            if best == self.sentence_end:
                break
            labels.append(best)
            accum, context, c, h, embedding = self.step(torch.tensor([best]), enc, lengths, accum, context, c, h)
        return labels


def tiny(features: int = 20, vocab: int = 10, seed: int = 0) -> I6AED:
    """Dims of 16-32; weights scaled as training would have made them (a random init attends flatly and decodes
    one label repeated): the label embedding, the LSTM state and the context drive the readout, the
    attention is sharp and the weight feedback moves it on, so decodes are varied label sequences."""
    torch.manual_seed(seed)
    model = I6AED(features, vocab)
    h, d = model.hidden, model.dim
    with torch.no_grad():
        model.embedding.weight.mul_(5)
        model.lstm.weight_ih.mul_(2)
        model.readout.weight[:, :h].mul_(20)
        model.readout.weight[:, h:h + d].mul_(4)
        model.readout.bias[model.sentence_end] -= 1.0
        model.query.weight.mul_(4)
        model.energy.weight.mul_(4)
        model.weight_feedback.weight.mul_(-8)
    return model.eval()


def label_scorer_job(seed: int = 0) -> dict:
    """``export_label_scorer`` arguments for the tiny i6-style AED as ``stateful-onnx``: the accumulated
    attention weights a state sized by the encoder frames (its dim named ``enc_time``; measured as the
    frames and tied to ``encoder_states``' time in every graph)."""
    from ..spec import Dim, TensorSpec
    from ..streaming import StateSpec
    model = tiny(seed=seed)
    hyps = Dim("hyps")
    return dict(kind="stateful", encoder=model.encode, encoder_dim=model.encoder_dim, module=model,
                features=TensorSpec("features", [Dim("batch"), Dim("time", min=7), 20], lengths=[1]),
                initial=model.initial_states, update=model.step, score=model.log_probs,
                states=[StateSpec("accum_att_weights", [hyps, Dim("enc_time"), 1]),
                        StateSpec("att_context", [hyps, model.dim]), StateSpec("lstm_c", [hyps, model.hidden]),
                        StateSpec("lstm_h", [hyps, model.hidden]), StateSpec("token_embedding", [hyps, model.embed])],
                updater_states=["accum_att_weights", "att_context", "lstm_c", "lstm_h"],
                scorer_states=["att_context", "lstm_h", "token_embedding"],
                vocabulary=["</s>"] + [f"label{i}" for i in range(1, model.vocab)], sentence_end=model.sentence_end)
