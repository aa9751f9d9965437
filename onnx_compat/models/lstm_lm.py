"""An LSTM language model, one label per step, its states ``[B, H]`` rows as RASR's state managers hold them.

``step(token [B], h_0, c_0, h_1, c_1, ...)`` -> ``(log_probs [B, V], new states)``: the label's embedding
through ``nn.LSTMCell`` layers from the states of the labels before it (zeros before the first). It is
what ``state-managed-onnx`` scores with ``[B, S]`` states; without encoder inputs RASR master's ``lstm``
manager meets undefined behaviour at the start context, so it is written for the ``transformer``
manager, one position per label (``export_label_scorer`` says why). ``greedy_decode`` is the model's own
decode from the start label.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn


class LstmLM(nn.Module):
    def __init__(self, vocab: int = 10, embed: int = 16, hidden: int = 32, layers: int = 2, sentence_end: int = 0):
        super().__init__()
        self.vocab, self.hidden, self.sentence_end = vocab, hidden, sentence_end
        self.embedding = nn.Embedding(vocab, embed)
        self.cells = nn.ModuleList(nn.LSTMCell(embed if i == 0 else hidden, hidden) for i in range(layers))
        self.output = nn.Linear(hidden, vocab)

    def step(self, token: torch.Tensor, *states: torch.Tensor):
        """One label ``[B]`` and the states ``h_0, c_0, ...`` ``[B, H]``: the next label's log-probs, the states."""
        x, new = self.embedding(token), []
        for i, cell in enumerate(self.cells):
            h, c = cell(x, (states[2 * i], states[2 * i + 1]))
            new += [h, c]
            x = h
        return (self.output(x).log_softmax(-1), *new)

    def state_specs(self, batch: str = "hyps"):
        from ..spec import Dim
        from ..streaming import StateSpec
        hyps = Dim(batch)
        return [StateSpec(f"{hc}{i}", [hyps, self.hidden]) for i in range(len(self.cells)) for hc in "hc"]

    @torch.no_grad()
    def greedy_decode(self, max_labels: int, start: int = None) -> List[int]:
        """Labels after ``start`` (default ``sentence_end``) until ``sentence_end`` (left out) or ``max_labels``."""
        states = [torch.zeros(1, self.hidden) for _ in range(2 * len(self.cells))]
        token, out = self.sentence_end if start is None else start, []
        for _ in range(max_labels):
            log_probs, *states = self.step(torch.tensor([token]), *states)
            token = int(log_probs[0].argmax())
            if token == self.sentence_end:
                break
            out.append(token)
        return out


def tiny(vocab: int = 10, seed: int = 0) -> LstmLM:
    """Two 32-unit layers; the embedding and output scaled as training would make them (a random init
    scores nearly uniform labels, and a decode would be one label repeated)."""
    torch.manual_seed(seed)
    model = LstmLM(vocab)
    with torch.no_grad():
        model.embedding.weight.mul_(3)
        for cell in model.cells:
            cell.weight_ih.mul_(2)
            cell.weight_hh.mul_(2)
        model.output.weight.mul_(6)
        model.output.bias[model.sentence_end] -= 1.5
    return model.eval()
