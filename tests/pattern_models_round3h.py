"""Small models of recurrences written as sru's naive CPU path writes them (``sru/ops.py:206-248``), issue #47.

Both directions of a bidirectional cell over time-major ``[T, B, D]``, each step's inputs cut before the loop as
``.chunk(T)`` (pieces of one step each, indexed ``u[t]``), the backward direction as ``range(T - 1, -1, -1)`` or
``reversed(range(T))``, the state made ``[B, D]`` before the loop and ``[1, B, D]`` by the step's broadcasting,
each step's output stored ``h[t, :, d, :] = h_t`` and the last ``c_t`` read after the loop. ``BoundRangeCell`` binds
the range to a name first (``seq = range(T) if d == 0 else range(T - 1, -1, -1)``, then ``for t in seq``).
"""
import math

import torch
from torch import nn


class TwoWayCell(nn.Module):
    """sru's recurrence with ``range`` on the ``for`` line: forward ``range(T)``, backward ``range(T - 1, -1, -1)``."""

    def __init__(self, d: int = 8, backward: str = "counts_down"):
        super().__init__()
        self.proj = nn.Linear(d, 2 * 3 * d)
        self.forget_w = nn.Parameter(torch.randn(2, d) * 0.5)
        self.d, self.backward = d, backward

    def forward(self, x):  # x: [B, T, D]
        x = x.transpose(0, 1)
        T, B, d = x.shape[0], x.shape[1], self.d
        U = self.proj(x).view(T, B, 2, d, 3)
        h = x.new_zeros(T, B, 2, d)
        last = []
        for di in range(2):
            c_prev = x.new_zeros(B, d)
            u0 = U[:, :, di, :, 0].chunk(T)
            u1 = (U[:, :, di, :, 1] + 0.5).chunk(T)
            u2 = U[:, :, di, :, 2].chunk(T)
            fw = self.forget_w[di].expand(B, d)
            counts_down = self.backward == "counts_down"
            for t in (range(T) if di == 0 else range(T - 1, -1, -1) if counts_down else reversed(range(T))):
                forget_t = (u1[t] + c_prev * fw).sigmoid()
                c_t = u0[t] + (c_prev - u0[t]) * forget_t
                c_prev = c_t
                h_t = c_t.tanh() * u2[t].sigmoid()
                h[t, :, di, :] = h_t
            last.append(c_t.view(B, d))
        return h.view(T, B, -1).transpose(0, 1), torch.stack(last, dim=1).view(B, -1)


class BoundRangeCell(nn.Module):
    """The same recurrence with the range bound to a name before the loop, as sru writes it; its initial state
    and skip input are strided views (``c_init[:, di, :]``, ``U[..., 2]``), as sru's are."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, 2 * 3 * d)
        self.d = d

    def forward(self, x):  # x: [B, T, D]
        x = x.transpose(0, 1)
        length, batch, d = x.shape[0], x.shape[1], self.d
        U = self.proj(x).view(length, batch, 2, d, 3)
        x_prime = U[..., 2]
        c_init = torch.stack([x[0], -x[0]], dim=1) * 0.1  # [B, 2, D]
        h = x.new_zeros(length, batch, 2, d)
        c_final = []
        for di in range(2):
            time_seq = range(length) if di == 0 else range(length - 1, -1, -1)
            c_prev = c_init[:, di, :]
            u0 = U[:, :, di, :, 0].chunk(length)
            u1 = U[:, :, di, :, 1].chunk(length)
            xp = x_prime[:, :, di, :].chunk(length)
            for t in time_seq:
                c_t = u0[t] + (c_prev - u0[t]) * u1[t].sigmoid()
                c_prev = c_t
                if x_prime is not None:
                    h_t = xp[t] + c_t.tanh()
                else:
                    h_t = c_t.tanh()
                h[t, :, di, :] = h_t
            c_final.append(c_t.view(batch, d))
        return h.view(length, batch, -1).transpose(0, 1), torch.stack(c_final, dim=1).view(batch, -1)


class PadToMultiple(nn.Module):
    """A strided encoder that pads the time to a multiple of its stride only when it is not one, as torchaudio's
    HDemucs writes it (``_hdemucs.py:158``: ``if not le % self.stride == 0: x = F.pad(...)``), or with the width
    computed first (``if pad > 0:``) or the remainder's truth (``if le % k:``)."""

    def __init__(self, form: str = "hdemucs"):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 8, stride=4)
        self.stride, self.form = 4, form

    def forward(self, x):  # [B, 2, T]
        le = x.shape[-1]
        if self.form == "hdemucs":
            if not le % self.stride == 0:
                x = nn.functional.pad(x, (0, self.stride - (le % self.stride)))
        elif self.form == "width_first":
            pad = (self.stride - le % self.stride) % self.stride
            if pad > 0:
                x = nn.functional.pad(x, (0, pad))
        else:
            if le % self.stride:
                x = nn.functional.pad(x, (0, self.stride - le % self.stride), value=0.5)
        return self.conv(x)


class PaddedBlocks(nn.Module):
    """Frames in blocks of 4, padded to a multiple of 4 only where they are not one, the padding's effect undone
    behind the same kind of branch. "granite": transformers' Granite speech encoder
    (``modeling_granite_speech.py:176-202``): a lone pad at the end, attention within each block, then a second
    ``if remainder > 0:`` that builds a mask (``mask[:remainder, :remainder] = 0``) and fills the padded scores of
    each sequence's last block. "landmarks": nystrom-attention (``nystrom_attention.py:73-78``): the width named in
    the branch, the frames and their padding mask padded at the front, the mask's pad behind an ``if`` of its own
    (``if mask is not None:``), then each frame attends to the blocks' masked means (``ceil(n / 4)`` of them).
    ``rounded=True`` spells Granite's remainder ``t - t // 4 * 4``."""

    def __init__(self, form: str = "granite", dim: int = 8, rounded: bool = False):
        super().__init__()
        self.qk = nn.Linear(dim, 2 * dim)
        self.form, self.block, self.rounded = form, 4, rounded

    def forward(self, x):  # [B, T, D]
        return self._granite(x) if self.form == "granite" else self._landmarks(x, x[..., 0] > -0.5)

    def _granite(self, x):
        b, t, _ = x.shape
        blocks = math.ceil(t / self.block)
        remainder = t - t // self.block * self.block if self.rounded else t % self.block
        if remainder > 0:
            x = nn.functional.pad(x, (0, 0, 0, self.block - remainder))
        q, k = self.qk(x).reshape(b * blocks, self.block, -1).chunk(2, dim=-1)
        scores = q @ k.transpose(1, 2)
        if remainder > 0:
            mask = torch.ones(self.block, self.block, dtype=torch.bool)
            mask[:remainder, :remainder] = False
            scores[blocks - 1::blocks].masked_fill_(mask, -1e4)
        out = scores.softmax(-1) @ x.reshape(b * blocks, self.block, -1)
        return out.reshape(b, blocks * self.block, -1)[:, :t]

    def _landmarks(self, x, mask=None):
        b, n, _ = x.shape
        remainder = n % self.block
        if remainder > 0:
            padding = self.block - (n % self.block)
            x = nn.functional.pad(x, (0, 0, padding, 0), value=0)
            if mask is not None:
                mask = nn.functional.pad(mask, (padding, 0), value=False)
        landmarks = math.ceil(n / self.block)
        x = x * mask[..., None]
        sums = x.reshape(b, landmarks, self.block, -1).sum(2)
        means = sums / (mask.reshape(b, landmarks, self.block).sum(2, keepdim=True) + 1e-3)
        q, _ = self.qk(x).chunk(2, dim=-1)
        return ((q @ means.transpose(1, 2)).softmax(-1) @ means)[:, -n:]


class ExpertSkip(nn.Module):
    """A mixture-of-experts feed-forward routed per frame, looping over its experts as mambapy's Jamba and
    Mixtral-style blocks do (``mambapy/jamba.py:497-507``): each frame's top-``k`` experts by router score, then
    for each expert the frames routed to it (``torch.where`` of its mask: a size only the data decides),
    skipped when there are none, the expert's output weighted and added back with ``index_add_``. ``test``
    spells the skip's condition ("eq": ``top_x.shape[0] == 0``, "lt": ``top_x.size(0) < 1``, "not":
    ``not top_x.numel()``; "flag": ``routed = top_x.shape[0] > 0``, ``if not routed``, the same skip; "inverted":
    ``empty = top_x.shape[0] == 0``, ``if not empty``, skipping every expert that got a frame). ``mean=True``: the
    step also adds the mean of the expert's outputs to every frame (their sum over their count), 0 / 0 on an
    empty selection: the skip is then more than a shortcut. ``lists=True`` gathers by Python lists of the
    indices (``top_x.tolist()``), as Jamba does."""

    def __init__(self, d: int = 8, experts: int = 6, k: int = 2, test: str = "eq", mean: bool = False,
                 lists: bool = False):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(experts))
        self.k, self.test, self.mean, self.lists = k, test, mean, lists

    def forward(self, x):  # x: [B, T, D]
        B, T, D = x.shape
        hidden = x.reshape(-1, D)
        weights, chosen = torch.softmax(self.router(hidden), dim=-1).topk(self.k, dim=-1)
        mask = torch.nn.functional.one_hot(chosen, len(self.experts)).permute(2, 1, 0)  # [E, k, B*T]
        out = torch.zeros_like(hidden)
        for e, expert in enumerate(self.experts):
            idx, top_x = torch.where(mask[e])
            if self.test == "eq":
                if top_x.shape[0] == 0:
                    continue
            elif self.test == "not":
                if not top_x.numel():
                    continue
            elif self.test == "flag":
                routed = top_x.shape[0] > 0
                if not routed:
                    continue
            elif self.test == "inverted":
                empty = top_x.shape[0] == 0
                if not empty:
                    continue
            elif top_x.size(0) < 1:
                continue
            if self.lists:  # Jamba's "faster to index using lists": hidden[None, top_x.tolist()]
                rows, slots = top_x.tolist(), idx.tolist()
                y = expert(hidden[None, rows].reshape(-1, hidden.shape[-1])) * weights[rows, slots, None]
            else:
                y = expert(hidden[top_x]) * weights[top_x, idx, None]
            out.index_add_(0, top_x, y.to(out.dtype))
            if self.mean:
                out = out + y.sum(0) / top_x.shape[0]
        return (x + out.reshape(B, T, D)).tanh()
