"""Small models of round-three first-contact patterns (issue #47): an LSTM wrapper that packs only what is not
packed yet (stanza's PackedLSTM under its character LM), and the diagonal of a score matrix masked with -inf
(torch-struct's dependency-tree partition), and torch-struct's writes into a diagonal and through ``.data``. Used by
test_round3_fixes_a.py.

Kept out of the test modules, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
import torch
import torch.nn as nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence


# --- a packing passed to a wrapper that packs unless isinstance(x, PackedSequence) ------------------

class PackIfNeeded(nn.Module):
    """stanza's PackedLSTM: takes a padded batch or a packing, with the lengths either way, and packs only the
    former; the LSTM gets an explicit initial state."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, batch_first=True)

    def forward(self, x, lengths, hx):
        if not isinstance(x, PackedSequence):
            x = pack_padded_sequence(x, lengths, batch_first=True)
        return self.lstm(x, hx)


class PackedCharLM(nn.Module):
    """stanza's CharacterLanguageModel: packs its embedded input (lengths longest first, as stanza's callers sort
    them), hands the packing and the lengths to the wrapper with a learned initial state expanded to the batch,
    unpacks the outputs and decodes them. Returns the logits [B, T, 6] and the final hidden state [1, B, 12]."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.rnn = PackIfNeeded()
        self.h0 = nn.Parameter(torch.randn(1, 1, 12) * 0.1)
        self.c0 = nn.Parameter(torch.randn(1, 1, 12) * 0.1)
        self.decoder = nn.Linear(12, 6)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(torch.tanh(self.proj(x)), lengths, batch_first=True)
        batch = x.size(0)
        hx = (self.h0.expand(1, batch, 12).contiguous(), self.c0.expand(1, batch, 12).contiguous())
        out, (h, _) = self.rnn(packed, lengths, hx=hx)
        out = pad_packed_sequence(out, batch_first=True)[0]
        return self.decoder(out), h


# --- the diagonal of a score matrix masked with -inf ------------------------------------------------

class MaskedScoreDiagonal(nn.Module):
    """Arc scores [B, T, T] of a dependency parser, the arcs of padded tokens set to -inf, and the diagonal (the
    root scores) read with ``torch.diagonal(scores, 0, -2, -1)``.

    ``form``: "roots" returns the root scores ``exp`` of the diagonal [B, T] (0 at padded tokens);
    "laplacian" builds torch-struct's matrix-tree Laplacian [B, T, T] as its dependency CRF does: off-diagonal
    ``-exp(score)``, the column sums put on the diagonal with ``diag_embed``, a 1 on the diagonal of each padded
    token (``diag_embed`` of the padding), row 0 replaced by the root scores; "readers" reads diagonals in
    every other way torch has (``Tensor.diagonal`` with an offset, ``torch.diag`` of a matrix and of a vector,
    ``torch.linalg.diagonal``, ``torch.trace``)."""

    def __init__(self, form="roots"):
        super().__init__()
        self.form = form
        self.head, self.dep = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, lengths):
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]  # [B, T]
        scores = self.head(x) @ self.dep(x).transpose(1, 2)
        scores = scores.masked_fill(~(valid[:, :, None] & valid[:, None, :]), float("-inf"))
        roots = torch.diagonal(scores, 0, -2, -1).exp()
        if self.form == "roots":
            return roots
        if self.form == "readers":
            return self.readers(scores)
        eye = torch.eye(x.shape[1], device=x.device, dtype=torch.bool)
        arcs = scores.exp().masked_fill(eye, 0)
        laplacian = -arcs + torch.diag_embed(arcs.sum(1), offset=0, dim1=-2, dim2=-1)
        laplacian = laplacian + torch.diag_embed((~valid).float())
        return torch.cat([roots[:, None, :], laplacian[:, 1:]], dim=1)

    @staticmethod
    def readers(scores):
        """Every other way of reading a diagonal, of scores holding -inf (``exp`` makes them 0): the diagonals
        above and below the main one [B, 2(T - 1)], and the last item's root scores read by ``torch.diag``, put
        back on a matrix by ``torch.diag`` and added to its ``torch.trace`` [T, T]."""
        above = scores.diagonal(1, 1, 2).exp()
        below = torch.linalg.diagonal(scores, offset=-1).exp()
        last = torch.diag(scores[-1]).exp()
        embedded = torch.diag(last)
        return torch.cat([above, below], dim=1), embedded + torch.trace(embedded)


class DiagonalWrite(nn.Module):
    """torch-struct's linear-chain chart: a log-semiring chart [1, B, T, C, C] filled with its zero (-1e5), its
    diagonals set to the semiring's one in place through a view (``chart[:, :, :].diagonal(0, 3, 4).fill_(0.0)``,
    as ``semiring.one_`` does), then the potentials added and the chart reduced. A diagonal read as a copy would
    lose the write: the output would be ~-1e5 where eager gives about the potentials' logsumexp.

    ``values=True`` also writes values through views: the first state's potentials onto the main diagonal
    (``copy_``) and, below it, the diagonal of the potentials shifted by one state (an offset of -1)."""

    def __init__(self, states: int = 5, values: bool = False):
        super().__init__()
        self.states, self.values = states, values

    def forward(self, x):  # x: [B, T, C, C] edge potentials
        B, T = x.shape[0], x.shape[1]
        chart = torch.zeros(1, B, T, self.states, self.states, dtype=x.dtype).fill_(-1e5)
        chart[:, :, :].diagonal(0, 3, 4).fill_(0.0)
        if self.values:
            chart[0].diagonal(0, 2, 3).copy_(x[..., 0])
            chart[0].diagonal(-1, -2, -1)[:] = x.diagonal(1, 2, 3) * 0.5
        return torch.logsumexp((chart + x[None]).flatten(2), dim=-1)[0]  # [B]


class DataAliases(nn.Module):
    """torch-struct's linear chain masks the padded steps of its potentials through ``.data``
    (``semiring.zero_mask_(lp.data, mask)``), and older code reads ``.data`` as a value: a write and a read
    through the alias, beside a parameter's ``.data`` read in the forward (a weight constrained on the fly)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x, lengths):  # x: [B, T, D], lengths: [B]
        B, T = x.shape[0], x.shape[1]
        scores = self.proj(x) + x @ self.proj.weight.data.clamp(-0.2, 0.2)
        padded = torch.arange(T, device=x.device).view(1, T) >= lengths.view(B, 1)
        scores.data.masked_fill_(padded.unsqueeze(-1), -1e4)
        return torch.stack([scores.data.logsumexp(1), scores.logsumexp(1)], dim=-1)  # [B, D, 2]
