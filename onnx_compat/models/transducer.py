"""An LSTM transducer (RNN-T), written the way a user writes one, with its PyTorch greedy decode.

Encoder: features ``[B, T, F]`` -> Linear -> LSTM -> ``[B, T, E]`` (no
subsampling; the lengths pass through). Prediction network: an embedding of
the last label -> a ``layers``-deep LSTM whose ``(h, c)`` are ``[layers, B,
P]`` (PyTorch's layout, hypothesis batch second) and whose output ``[B, P]``
the joint reads. Joint: ``tanh(enc W + pred U) -> V`` log-probs, blank one
of the columns (``blank``, the last by default). The prediction network
starts from zeros fed the blank as its start label.

``greedy_decode``: the standard time-synchronous greedy search: at each
frame, emit the best label and stay on the frame (at most ``max_symbols``
per frame) until blank advances; with ``vertical=False`` every symbol
advances (RNA-style, one symbol per frame). ``StatelessTransducer`` is the
same with a prediction network over the last ``context`` labels only (no
state: RASR's ``fixed-context-onnx``, sherpa-onnx's stateless decoder).
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import nn

from ..spec import Dim, TensorSpec


class Joint(nn.Module):
    def __init__(self, encoder_dim: int, pred_dim: int, joint_dim: int, vocab: int):
        super().__init__()
        self.enc = nn.Linear(encoder_dim, joint_dim)
        self.pred = nn.Linear(pred_dim, joint_dim, bias=False)
        self.out = nn.Linear(joint_dim, vocab)

    def forward(self, frame: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """``frame`` ``[B, E]``, ``pred`` ``[B, P]`` -> log-probs ``[B, V]``."""
        return self.out(torch.tanh(self.enc(frame) + self.pred(pred))).log_softmax(-1)


class Encoder(nn.Module):
    def __init__(self, features: int, dim: int, layers: int = 1):
        super().__init__()
        self.input = nn.Linear(features, dim)
        self.lstm = nn.LSTM(dim, dim, layers, batch_first=True)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor):
        y, _ = self.lstm(torch.relu(self.input(features)))
        return y, lengths


class LSTMTransducer(nn.Module):
    def __init__(self, features: int = 20, vocab: int = 12, encoder_dim: int = 32, pred_dim: int = 24,
                 layers: int = 2, joint_dim: int = 32, blank: int = -1):
        super().__init__()
        self.vocab, self.layers, self.pred_dim = vocab, layers, pred_dim
        self.blank = blank % vocab
        self.encoder = Encoder(features, encoder_dim)
        self.embedding = nn.Embedding(vocab, pred_dim)
        self.prediction = nn.LSTM(pred_dim, pred_dim, layers)  # not batch_first: (h, c) are [layers, B, P]
        self.joint = Joint(encoder_dim, pred_dim, joint_dim, vocab)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor):
        """``[B, T, F]``, ``[B]`` -> ``[B, T, E]``, ``[B]``."""
        return self.encoder(features, lengths)

    def initial_states(self):
        """The prediction network after the start label (blank) from zeros, at batch 1: ``(h, c, out)``."""
        zeros = torch.zeros(self.layers, 1, self.pred_dim)
        return self.predict(torch.full((1,), self.blank, dtype=torch.long), zeros, zeros)

    def predict(self, token: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """One label ``[B]`` through the prediction network: ``(h, c)`` ``[layers, B, P]`` -> new ``(h, c, out)``."""
        y, (h, c) = self.prediction(self.embedding(token.long())[None], (h, c))
        return h, c, y[0]

    def score(self, frame: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """One encoder frame ``[B, E]`` and the prediction output ``[B, P]`` -> log-probs ``[B, V]``."""
        return self.joint(frame, out)

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, length: int = None, max_symbols: int = 3,
                      vertical: bool = True) -> List[int]:
        """The greedy decode of one utterance ``[1, T, F]``: the emitted labels, blanks left out."""
        lengths = torch.tensor([features.shape[1] if length is None else length], dtype=torch.int32)
        enc, enc_len = self.encode(features, lengths)
        h, c, out = self.initial_states()
        labels: List[int] = []
        t, emitted = 0, 0
        while t < int(enc_len[0]):
            best = int(self.score(enc[:, t], out).argmax(-1))
            if best == self.blank or (vertical and emitted >= max_symbols):
                t, emitted = t + 1, 0
                continue
            labels.append(best)
            h, c, out = self.predict(torch.tensor([best]), h, c)
            emitted += 1
            if not vertical:
                t, emitted = t + 1, 0
        return labels


class StatelessTransducer(nn.Module):
    """A transducer whose prediction network sees only the last ``context`` labels (no recurrent state)."""

    def __init__(self, features: int = 20, vocab: int = 12, encoder_dim: int = 32, pred_dim: int = 24,
                 context: int = 2, joint_dim: int = 32, blank: int = -1):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.blank = blank % vocab
        self.encoder = Encoder(features, encoder_dim)
        self.embedding = nn.Embedding(vocab, pred_dim)
        self.mix = nn.Linear(context * pred_dim, pred_dim)
        self.joint = Joint(encoder_dim, pred_dim, joint_dim, vocab)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor):
        return self.encoder(features, lengths)

    def score(self, frame: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """``frame`` ``[B, E]``, ``history`` ``[B, context]`` (oldest first) -> log-probs ``[B, V]``."""
        pred = torch.relu(self.mix(self.embedding(history.long()).flatten(1)))
        return self.joint(frame, pred)

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, max_symbols: int = 3, vertical: bool = True,
                      start: int = None) -> List[int]:
        lengths = torch.tensor([features.shape[1]], dtype=torch.int32)
        enc, _ = self.encode(features, lengths)
        history = [self.blank if start is None else start] * self.context
        labels: List[int] = []
        t, emitted = 0, 0
        while t < enc.shape[1]:
            best = int(self.score(enc[:, t], torch.tensor([history])).argmax(-1))
            if best == self.blank or (vertical and emitted >= max_symbols):
                t, emitted = t + 1, 0
                continue
            labels.append(best)
            history = history[1:] + [best]
            emitted += 1
            if not vertical:
                t, emitted = t + 1, 0
        return labels


def feature_spec(features: int = 20) -> TensorSpec:
    """``features`` ``[B, T, F]`` with its lengths ``features:size1`` (int32)."""
    return TensorSpec("features", [Dim("batch"), Dim("time"), features], lengths=[1])


def _lively(joint: Joint, blank: int) -> None:
    """Weights a random init would not have: the frame dominates the joint and blank wins about every other
    frame, so an untrained tiny model decodes varied labels and blanks (a decode of one label repeated, or
    of nothing, would prove little)."""
    with torch.no_grad():
        joint.enc.weight.mul_(4)
        joint.out.weight.mul_(2)
        joint.out.bias[blank] += 0.85


def tiny(features: int = 20, vocab: int = 12, seed: int = 0) -> Tuple[LSTMTransducer, TensorSpec]:
    """Seconds to export: for tests and the docs."""
    torch.manual_seed(seed)
    model = LSTMTransducer(features, vocab)
    _lively(model.joint, model.blank)
    return model.eval(), feature_spec(features)


def tiny_stateless(features: int = 20, vocab: int = 12, context: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    model = StatelessTransducer(features, vocab, context=context)
    _lively(model.joint, model.blank)
    return model.eval(), feature_spec(features)


def label_scorer_job(kind: str = "transducer", seed: int = 0) -> dict:
    """``export_label_scorer`` arguments: the tiny LSTM transducer as ``stateful-transducer-onnx``
    (``kind="transducer"``, RASR's open PR #149) or the stateless one as ``fixed-context-onnx``
    (``kind="fixed-context"``, RASR master); the factory the ``label-scorer`` verb takes."""
    from ..streaming import StateSpec
    vocabulary = [f"label{i}" for i in range(11)] + ["<blank>"]
    if kind == "fixed-context":
        model, feat = tiny_stateless(seed=seed)
        return dict(kind="fixed-context", encoder=model.encode, features=feat, encoder_dim=32, score=model.score,
                    vocabulary=vocabulary, blank=model.blank, history=model.context, start_label=model.blank,
                    module=model)
    model, feat = tiny(seed=seed)
    hyps = Dim("hyps")
    L, P = model.layers, model.pred_dim
    return dict(kind="transducer", release="transducer-pr", encoder=model.encode, features=feat, encoder_dim=32,
                initial=model.initial_states, update=model.predict, score=model.score,
                states=[StateSpec("h", [L, hyps, P]), StateSpec("c", [L, hyps, P]), StateSpec("out", [hyps, P])],
                updater_states=["h", "c"], scorer_states=["out"], vocabulary=vocabulary, blank=model.blank,
                module=model)


def fixed_context_label_scorer_job() -> dict:
    """The stateless transducer as ``fixed-context-onnx`` (a factory without arguments, for the command line)."""
    return label_scorer_job("fixed-context")
