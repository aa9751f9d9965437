"""Small models of issue #47's items 7 and 8 (a WavLM-style padding-mask reduction; time cut into fixed-size
patches), and a model whose patched export is worse than the plain one under one exporter (for the ``auto``
property of test_auto_steps.py). Used by test_patterns_round3.py and test_auto_steps.py.

Kept out of the test modules, as pattern_models.py is: pytest rewrites the ``assert`` statements of test
modules, and model code must reach the exporters as a library has it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# --- 7. a WavLM-style SSL encoder: the padding mask reduced to the frames --------------------------

class SSLPaddingMask(nn.Module):
    """fairseq's wav2vec 2.0 / HuBERT and WavLM (unilm, s3prl): a strided conv feature extractor over the
    waveform, then the sample-level padding mask reduced to the frames by ``forward_padding_mask``: the
    remainder ``padding_mask.size(1) % features.size(1)`` trimmed off behind ``if extra > 0:``, the rest viewed
    as ``[B, frames, -1]`` and a frame padded when all its samples are."""

    def __init__(self):
        super().__init__()
        self.extractor = nn.Sequential(nn.Conv1d(1, 8, 10, stride=5), nn.GELU(), nn.Conv1d(8, 8, 3, stride=2),
                                       nn.GELU())
        self.proj = nn.Linear(8, 8)

    def forward(self, wav, lengths):  # [B, T] samples -> [B, frames, 8]
        padding_mask = torch.arange(wav.shape[1], device=wav.device)[None, :] >= lengths[:, None]
        features = self.extractor(wav[:, None]).transpose(1, 2)
        padding_mask = self.forward_padding_mask(features, padding_mask)
        return self.proj(features).masked_fill(padding_mask[..., None], 0.0)

    def forward_padding_mask(self, features, padding_mask):
        extra = padding_mask.size(1) % features.size(1)
        if extra > 0:
            padding_mask = padding_mask[:, :-extra]
        padding_mask = padding_mask.view(padding_mask.size(0), features.size(1), -1)
        padding_mask = padding_mask.all(-1)
        return padding_mask


# --- 8. time cut into fixed-size patches ----------------------------------------------------------

class TimePatches(nn.Module):
    """An audio transformer's patch embedding over time: the frames cut into patches of ``size`` and each
    patch projected. ``form``: "split_padded" pads the frames to a multiple of the patch
    (``F.pad(x, (0, 0, 0, -T % size))``) and stacks ``x.split(size, dim=1)``; "split" stacks the split of
    frames the caller gives as a multiple of the patch (a declared ``Dim(multiple=size)``); "unfold" cuts
    with ``x.unfold(1, size, size)`` (a remainder dropped); "split_loop" projects each piece in a Python loop."""

    def __init__(self, form="split_padded", size=16):
        super().__init__()
        self.form, self.size = form, size
        self.proj = nn.Linear(8 * size, 8)

    def forward(self, x):  # [B, T, 8] -> [B, patches, 8]
        if self.form == "unfold":
            patches = x.unfold(1, self.size, self.size)  # [B, n, 8, size]
        elif self.form == "split_loop":  # each patch on its own: a Python loop over the pieces
            x = F.pad(x, (0, 0, 0, -x.shape[1] % self.size))
            return torch.stack([self.proj(p.flatten(1)) for p in x.split(self.size, dim=1)], dim=1)
        else:
            if self.form == "split_padded":
                x = F.pad(x, (0, 0, 0, -x.shape[1] % self.size))
            patches = torch.stack(x.split(self.size, dim=1), dim=1)  # [B, n, size, 8]
        return self.proj(patches.flatten(2))


class ChunkedFeedForward(nn.Module):
    """A position-wise feed-forward run chunk by chunk to save memory, as reformer-pytorch's ``Chunk`` runs it:
    ``torch.cat([ff(c) for c in x.chunk(n, dim=1)], dim=1)``; the count of pieces, ``ceil(T / ceil(T / n))``,
    depends on the length (37 frames in 100 chunks: 37 pieces). ``carried``: a running sum carried from chunk to
    chunk, as performer-pytorch's causal linear attention carries its prefix sums. ``stepped``: a state stepped
    once per chunk, as a block-recurrent transformer steps its memory: the cut is the model's, not only memory's."""

    def __init__(self, chunks: int = 100, carried: bool = False, stepped: bool = False, bounded: bool = False):
        super().__init__()
        self.chunks, self.carried, self.stepped, self.bounded = chunks, carried, stepped, bounded
        self.ff = nn.Linear(8, 8)

    def forward(self, x):
        if self.stepped:
            state, outs = x.new_zeros(x.shape[0], 1, 8), []
            for piece in x.chunk(self.chunks, dim=1):
                y = self.ff(piece) + state
                state = torch.tanh(y.mean(1, keepdim=True))
                outs.append(y)
            return torch.cat(outs, dim=1)
        if not self.carried:
            return torch.cat([self.ff(c) for c in x.chunk(self.chunks, dim=1)], dim=1)
        last, outs = 0, []  # a running sum carried from chunk to chunk (performer-pytorch's causal linear attention)
        for c in x.chunk(self.chunks, dim=1):
            assert not self.bounded or c.shape[1] <= 8  # ``bounded``: pieces of 8 frames at most, the model says
            total = last + self.ff(c).cumsum(1)
            last = total[:, -1:]
            outs.append(total)
        return torch.cat(outs, dim=1)


# --- a patch that costs one exporter the graph ------------------------------------------------------

class ComplexDiff(nn.Module):
    """A spectrogram's frame-to-frame difference, ``torch.diff`` of the complex STFT: the spectral patches carry
    the spectrum as a real/imaginary pair, which ``diff`` does not take (patched dynamo fails), while the plain
    dynamo export verifies; ``export(exporter="dynamo")`` must then retry without the patches."""

    def forward(self, x):  # [B, T] -> [B, 17, frames - 1]
        spec = torch.stft(x, 32, 8, window=torch.hann_window(32, device=x.device), return_complex=True)
        return torch.diff(spec, dim=-1).abs()


# --- 9. segments whose stride is the whole length (EnCodec's encode with no segment set) ------------

class WholeLengthSegments(nn.Module):
    """EnCodec's ``EncodecModel.encode``: the input cut into segments at a stride, each encoded, the codes
    decoded per segment. With no segment set (``segment=None``) the segment and the stride are the whole
    length, so ``range(0, length, stride)`` is one step, offset 0, at every length; with a segment set it is
    real chunking, whose count follows the length."""

    def __init__(self, segment=None):
        super().__init__()
        self.segment = segment
        self.encoder = nn.Conv1d(1, 4, 5, padding=2)
        self.decoder = nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, x):  # [B, 1, T] -> [B, 1, T]
        _, channels, length = x.shape
        if self.segment is None:
            segment_length = length
            stride = length
        else:
            segment_length = stride = self.segment
        encoded_frames = []
        for offset in range(0, length, stride):
            frame = x[:, :, offset: offset + segment_length]
            encoded_frames.append(torch.tanh(self.encoder(frame)))
        return self.decoder(torch.cat(encoded_frames, -1))[:, :, :x.shape[-1]]
