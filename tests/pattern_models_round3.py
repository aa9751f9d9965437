"""Small models of their own for the patterns of issue #47 (coverage on first contact, round three), used by
test_patterns_round3.py.

Kept out of the test module, as pattern_models.py is: pytest rewrites the ``assert`` statements of test modules,
and model code must reach the exporters as a library has it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from pattern_models import _DeclaresLengths


# --- 4. Python's len() and max()/min() over tensors ----------------------------------------------

class LenAsBatch(_DeclaresLengths):
    """The batch read with Python's ``len()``: of the input (``b = len(x)``, a reshape by it) or of the lengths
    (``batch_size = len(lengths)``, a mask expanded to it)."""

    def __init__(self, of="input"):
        super().__init__()
        self.of, self.proj = of, nn.Linear(8, 8)

    def body(self, x, lengths):
        if self.of == "input":
            b = len(x)
            pooled = self.proj(x).reshape(b, -1, 4).sum(1)
            return pooled.repeat(1, 2) / lengths[:, None]
        batch_size = len(lengths)
        mask = torch.arange(x.shape[1])[None, :].expand(batch_size, -1) < lengths[:, None]
        return (self.proj(x) * mask[..., None]).sum(1) / lengths[:, None]


class BuiltinReduction(_DeclaresLengths):
    """Python's builtin ``max``/``min`` over a lengths tensor (a library's own caller: ``max(wav_lengths)``
    sizing a padding mask; ``min(lengths)`` cropping every sequence to the shortest; ``max(energy)`` of a float
    tensor normalising by the loudest frame)."""

    def __init__(self, form="max", declares=True):
        super().__init__()
        self.form, self.declares, self.proj = form, declares, nn.Linear(8, 8)

    def body(self, x, lengths):
        if self.form == "max":
            mask = torch.arange(max(lengths))[None, :] < lengths[:, None]
            return (self.proj(x) * mask[..., None]).sum(1) / lengths[:, None]
        if self.form == "peak":  # over a float tensor: the loudest frame's mean magnitude normalises
            energy = x.abs().mean((0, 2))
            return self.proj(x / max(energy) + min(energy)).sum(1) / lengths[:, None]
        shortest = min(lengths)
        return self.proj(x).narrow(1, 0, shortest).mean(1)


# --- 5. a traced size as a module argument -------------------------------------------------------

class GroupsFromShape(nn.Module):
    """``F.group_norm`` whose ``num_groups`` is computed from the channels' size (``h.shape[1] // 2``), and an
    ``nn.GroupNorm`` built with a size read off a shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.weight, self.bias = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))

    def forward(self, x):  # [B, T, 8] -> [B, 8, T]
        h = self.conv(x.transpose(1, 2))
        return F.group_norm(h, h.shape[1] // 2, self.weight, self.bias) + F.group_norm(h, h.shape[1] // 8)


class PoolKeepsAnAxis(nn.Module):
    """Adaptive pooling with ``None`` in the output size (that axis kept): ``(None, 1)`` pools the features of
    every frame, ``(1, None)`` the frames of every feature, ``(None, 3)`` three feature bins per frame."""

    def __init__(self, size=(None, 1), kind="avg"):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(size) if kind == "avg" else nn.AdaptiveMaxPool2d(size)

    def forward(self, x):  # [B, T, 8] -> [B, 3, T or 1, 1 or 3 or 8]
        return self.pool(self.conv(x[:, None]))


# --- 1, second half: a model that accepts only some inputs ---------------------------------------

class SortedPacked(nn.Module):
    """A BLSTM over packed sequences that requires them longest first (``enforce_sorted=True``): any other order
    of the lengths is refused by the eager model itself."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 6, batch_first=True, bidirectional=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=True)
        y, _ = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0]


class AtMostThree(nn.Module):
    """Refuses batches of more than three utterances, whatever their order."""

    def forward(self, x):
        if x.shape[0] > 3:
            raise ValueError("at most three utterances per batch")
        return torch.tanh(x) * 2


# --- 1, first half: a cache sized by the longest call before the export ---------------------------

class RotaryCache(nn.Module):
    """Rotary position embedding whose cos/sin tables are a cache grown to the longest sequence seen (the common
    ``if T > self.seq_len_cached`` form); ``names``: the attributes' names (a cache not named as one: "table")."""

    NAMES = {"cache": ("seq_len_cached", "cos_cached", "sin_cached"), "table": ("longest", "cos_table", "sin_table")}

    def __init__(self, dim=8, names="cache"):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim), persistent=False)
        self.names = self.NAMES[names]
        for name, value in zip(self.names, (0, None, None)):
            setattr(self, name, value)

    def forward(self, x):  # [B, T, D]
        T = x.shape[1]
        longest, cos_name, sin_name = self.names
        if T > getattr(self, longest):
            freqs = torch.outer(torch.arange(T, device=x.device).float(), self.inv_freq)
            emb = torch.cat((freqs, freqs), -1)
            setattr(self, longest, T)
            setattr(self, cos_name, emb.cos())
            setattr(self, sin_name, emb.sin())
        cos, sin = getattr(self, cos_name)[:T], getattr(self, sin_name)[:T]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin


class RotaryEncoder(nn.Module):
    """A projection and a rotary embedding, called once eagerly at ``warm`` frames before it is exported (the
    cache then holds ``warm`` rows)."""

    def __init__(self, warm=60, names="cache"):
        super().__init__()
        self.proj, self.rotary = nn.Linear(8, 8), RotaryCache(names=names)
        with torch.no_grad():
            self(torch.randn(1, warm, 8))

    def forward(self, x):
        return self.rotary(self.proj(x))


# --- 6. packed sequences under TorchScript ---------------------------------------------------------

class PackedForms(nn.Module):
    """Packing used other than as one pack -> RNN -> unpack pair: only the GRU's final state read ("final_state"),
    a packing unpacked as it is (padded frames zeroed, "unpacked_as_is"), the packed data changed by hand and
    packed again ("packed_data")."""

    def __init__(self, form):
        super().__init__()
        self.form, self.gru, self.lin = form, nn.GRU(8, 6, batch_first=True), nn.Linear(8, 8)

    def forward(self, x, lengths):
        rnn = nn.utils.rnn
        packed = rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        if self.form == "final_state":
            _, h = self.gru(packed)
            return h[-1]
        if self.form == "unpacked_as_is":
            return rnn.pad_packed_sequence(packed, batch_first=True, total_length=x.shape[1])[0] * 2
        packed = rnn.PackedSequence(torch.tanh(self.lin(packed.data)), packed.batch_sizes, packed.sorted_indices,
                                    packed.unsorted_indices)
        return rnn.pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=x.shape[1])[0]


class LenOfBuffer(nn.Module):
    """A loop over a buffer's entries by ``range(len(self.scales))`` (a size the model fixes) beside ``len(x)``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scales", torch.tensor([1.0, 2.0, 3.0]))

    def forward(self, x):
        out = x
        for k in range(len(self.scales)):
            out = torch.tanh(out * self.scales[k])
        return out * len(x)
