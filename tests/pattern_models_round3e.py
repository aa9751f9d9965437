"""Small models of round three's structured-prediction and time-series patterns (issue #47 items 2 and 3,
``test_round3_fixes_b.py``): a linear-chain CRF's forward algorithm stepped by ``range(1, T)`` over a
time-first layout (pytorch-crf's), its Viterbi backtrace through ``.item()``, marginals taken by
``torch.autograd.grad`` inside forward (torch-struct's), a chart padded to a power of two through
``math.log`` of the length, and periods picked from FFT amplitudes through ``.numpy()`` (TimesNet's).

Kept out of the test module, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
from __future__ import annotations


import torch
import torch.nn as nn


def _mask(lengths, steps: int):
    return torch.arange(steps)[None, :] < lengths[:, None]


class ChainCRFLikelihood(nn.Module):
    """The log-likelihood of tag paths under a linear-chain CRF, written as pytorch-crf writes it: inputs
    batch-first, transposed to time-first ``[T, B, ...]``, the first step's mask checked by
    ``if not mask[0].all(): raise``, and two Python loops ``for i in range(1, T)`` carrying a score: the gold
    path's (``score += ...`` with ``tags[i - 1]``, ``emissions[i, arange(B), tags[i]]``) and the normalizer's
    (a log-sum-exp step kept where ``mask[i]`` holds, ``torch.where``)."""

    def __init__(self, tags: int = 5):
        super().__init__()
        self.start = nn.Parameter(torch.randn(tags))
        self.end = nn.Parameter(torch.randn(tags))
        self.transitions = nn.Parameter(torch.randn(tags, tags))

    def forward(self, emissions, lengths, tags):
        mask = _mask(lengths, emissions.shape[1])
        emissions, tags, mask = emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)
        if not mask[0].all():
            raise ValueError("the first step of every sequence must be on")
        return self.gold_score(emissions, tags, mask) - self.normalizer(emissions, mask)

    def gold_score(self, emissions, tags, mask):
        steps, batch = tags.shape
        on = mask.float()
        score = self.start[tags[0]] + emissions[0, torch.arange(batch), tags[0]]
        for i in range(1, steps):
            score += self.transitions[tags[i - 1], tags[i]] * on[i]
            score += emissions[i, torch.arange(batch), tags[i]] * on[i]
        last = tags[on.long().sum(0) - 1, torch.arange(batch)]
        return score + self.end[last]

    def normalizer(self, emissions, mask):
        score = self.start + emissions[0]
        for i in range(1, emissions.size(0)):
            step = torch.logsumexp(score.unsqueeze(2) + self.transitions + emissions[i].unsqueeze(1), dim=1)
            score = torch.where(mask[i].unsqueeze(1), step, score)
        return torch.logsumexp(score + self.end, dim=1)


class GradientMarginals(nn.Module):
    """Edge marginals as the gradient of the log partition, as torch-struct computes them: the potentials made
    to need grad, a partition, then ``torch.autograd.grad`` of it inside forward."""

    def forward(self, potentials):  # [B, T, C, C]
        with torch.enable_grad():
            edges = potentials.detach().requires_grad_(True)
            log_z = edges.logsumexp((2, 3)).sum()
            return torch.autograd.grad(log_z, edges, create_graph=True)[0]


class ViterbiBacktrace(nn.Module):
    """Viterbi decoding as pytorch-crf writes it: a max-product step stepped by ``range(1, T)`` whose argmax
    indices are kept in a Python list, then a backtrace per sequence through ``.item()`` into Python lists,
    padded back into a tensor by the caller."""

    def __init__(self, tags: int = 5):
        super().__init__()
        self.transitions = nn.Parameter(torch.randn(tags, tags))

    def forward(self, emissions):  # [T, B, C]
        score, history = emissions[0], []
        for i in range(1, emissions.size(0)):
            score, indices = (score.unsqueeze(2) + self.transitions + emissions[i].unsqueeze(1)).max(dim=1)
            history.append(indices)
        paths = []
        for row in range(emissions.size(1)):
            best = [score[row].argmax().item()]
            for hist in reversed(history):
                best.append(hist[row][best[-1]].item())
            paths.append(torch.tensor(best[::-1]))
        return torch.stack(paths)


class EnergyForces(nn.Module):
    """Forces as the negative gradient of a learned energy, as interatomic-potential models return them: an
    energy from each position and from every pair's distance, then ``torch.autograd.grad`` of it with respect
    to the positions inside forward (no graph kept: ``create_graph`` left False)."""

    def __init__(self, dim: int = 3, hidden: int = 16):
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, positions):  # [B, T, 3]
        with torch.enable_grad():
            p = positions.detach().requires_grad_(True)
            pairs = (p.unsqueeze(1) - p.unsqueeze(2)).pow(2).sum(-1)
            energy = self.energy(p).sum() + torch.exp(-pairs).sum()
            forces, = torch.autograd.grad(energy, p)
        return -forces


class CheckedMarginals(nn.Module):
    """torch-struct's path to its marginals: the lengths checked against the chart (``assert max(lengths) <=
    N``, a value check), a masked partition, then its gradient. Below autograd the tensors traced are
    functional tensors, whose own ``bool()`` the check must be seen through."""

    def forward(self, potentials, lengths):  # [B, T, C, C], [B]
        assert max(lengths) <= potentials.shape[1], "Length longer than edge scores"
        with torch.enable_grad():
            edges = potentials.detach().requires_grad_(True)
            mask = torch.arange(potentials.shape[1])[None, :] < lengths[:, None]
            log_z = (edges.logsumexp((2, 3)) * mask).sum()
            return torch.autograd.grad(log_z, edges, create_graph=True)[0]
