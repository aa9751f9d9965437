"""Minimal reproductions of the sweep's failure patterns: a few lines of code each, in the form
the third-party library writes it, exported by both exporters with and without ``patched()``.

Needs only torch, onnx, onnxruntime and onnx_compat (the test env will do):

    python benchmarks/sweep/sweep_repros.py                 # every pattern, a line per exporter
    python benchmarks/sweep/sweep_repros.py --only fold     # those whose name contains "fold"

Each export is at B=3/T=37 with ``batch`` and ``time`` dynamic; the check is ONNX Runtime against
eager at B=1/T=23 (T=53 for the cache pattern, which breaks only past the length it cached). ``docs/sweep.md`` says which models each pattern stops.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Dict

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

import onnx_compat


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": None}


@dataclass(frozen=True)
class Repro:
    module: Callable[[], nn.Module]
    where: str  # the library code it stands for
    warm: bool = False  # the model runs once in eager before the export (as onnx_compat.export does)
    example: Callable[[int, int], torch.Tensor] = lambda b, t: torch.randn(b, t)


REPROS: Dict[str, Repro] = {}


def repro(where: str, warm: bool = False):
    def register(cls):
        REPROS[cls.__name__] = Repro(cls, where, warm)
        return cls
    return register


@repro("asteroid masknn/norms.py (gLN, cLN): ConvTasNet, DPRNN, DPTNet, LSTMTasNet, SuDORMRF, DeMask")
class ReductionDimsTolist(nn.Module):
    def forward(self, x):
        dims = torch.arange(1, len(x.shape)).tolist()
        mean = x.mean(dim=dims, keepdim=True)
        var = torch.var(x, dim=dims, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + 1e-8)


@repro("asteroid masknn/convolutional.py _fix_dcu_input_dims (DCUNet)")
class IntOfConstantTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.prod = np.array([4, 8])

    def forward(self, x):
        k = int(torch.from_numpy(self.prod)[1])
        return F.pad(x, (0, (k - x.shape[-1] % k) % k))


@repro("asteroid dsp/overlap_add.py DualPathProcessing.fold (DPRNN, DPTNet)")
class FoldDynamicOutput(nn.Module):
    def forward(self, x):
        b, t = x.shape
        frames = F.unfold(x[:, None, :, None], kernel_size=(8, 1), padding=(8, 0), stride=(4, 1))
        return F.fold(frames, (t, 1), kernel_size=(8, 1), padding=(8, 0), stride=(4, 1)).reshape(b, t)


@repro("julius core.unfold (LowPassFilter, SplitBands, fft_conv1d)")
class AsStridedFrames(nn.Module):
    def forward(self, x):
        length = x.shape[-1]
        n_frames = math.ceil((max(length, 8) - 8) / 4) + 1
        padded = F.pad(x, (0, (n_frames - 1) * 4 + 8 - length)).contiguous()
        frames = padded.as_strided([x.shape[0], n_frames, 8], [padded.stride(0), 4, 1])
        return frames.sum(-1)


@repro("encodec modules/conv.py get_extra_padding_for_conv1d; the same in DAC, SNAC, vocos")
class CeilOfLength(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 8, stride=4)

    def forward(self, x):
        length = x.shape[-1]
        ideal = (math.ceil((length - 8) / 4 + 1) - 1) * 4 + 8
        return self.conv(F.pad(x[:, None], (0, ideal - length)))


@repro("speechbrain dataio.length_to_mask (ECAPA-TDNN, Xvector, ...): len(lengths) as the batch size")
class LenOfTensorBatch(nn.Module):
    def forward(self, x):
        lengths = torch.ones(x.shape[0]) * x.shape[-1]
        t = x.shape[-1]
        mask = torch.arange(t, dtype=lengths.dtype).expand(len(lengths), t) < lengths.unsqueeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)


@repro("openunmix model.py OpenUnmix.forward: nb_frames, nb_samples, ... = x.data.shape")
class ShapeThroughData(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1, 4)

    def forward(self, x):
        b, t = x.data.shape
        return self.fc(x.reshape(-1, 1)).reshape(b, t, 4)


@repro("vocos spectral_ops.py ISTFT: the window envelope by F.fold, then assert (window_envelope > 1e-11).all()")
class AssertOnValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(8))

    def forward(self, x):
        t = x.shape[-1]
        window_sq = self.window.square().expand(1, t, -1).transpose(1, 2)
        envelope = F.fold(window_sq, output_size=(1, (t - 1) * 4 + 8), kernel_size=(1, 8), stride=(1, 4))
        envelope = envelope.squeeze()[4:-4]
        assert (envelope > 1e-11).all()
        return x * envelope.mean()


@repro("vector-quantize-pytorch EuclideanCodebook: if self.initted: (a bool tensor buffer); "
       "rotary-embedding-torch's frequency cache")
class BranchOnTensorBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("initted", torch.tensor([True]))

    def forward(self, x):
        if self.initted:
            return x * 2
        return x


@repro("einx (x-transformers attention): tuple(int(d) for d in tensor.shape) before a rearrange")
class IntShapesForRearrange(nn.Module):
    def forward(self, x):
        b, t = tuple(int(d) for d in x.shape)
        return x.reshape(b, t, 1).expand(b, t, 2).reshape(b, t * 2)


@repro("demucs utils.py center_trim(tensor, reference): a length traced as a 0-d tensor, then .size(-1)")
class SizeTracedAsTensor(nn.Module):
    def forward(self, x):
        length = x.shape[-1]          # while TorchScript traces, a 0-d tensor
        y = F.pad(x, (2, 2))
        ref = length.size(-1) if isinstance(length, torch.Tensor) else length
        delta = y.shape[-1] - ref
        return y[..., delta // 2: y.shape[-1] - (delta - delta // 2)]


@repro("julius resample.py ResampleFrac: torch.as_tensor(new_sr * length / old_sr), then floor and a slice")
class SizeThroughAsTensor(nn.Module):
    def forward(self, x):
        length = x.shape[-1]
        out_length = torch.floor(torch.as_tensor(3 * length / 2)).long()
        y = torch.repeat_interleave(x, 2, dim=-1)
        return y[..., :out_length]


@repro("rotary-embedding-torch RotaryEmbedding.forward's frequency cache (bs-roformer, mel-band-roformer, "
       "any model using it); any forward before the export fills it", warm=True)
class CacheFilledByEagerRun(nn.Module):
    def __init__(self):
        super().__init__()
        self.cached, self.cached_len = None, 0

    def forward(self, x):
        t = x.shape[-1]
        if self.cached is not None and t <= self.cached_len:
            positions = self.cached[:t]
        else:
            positions = torch.arange(t, dtype=x.dtype)
            self.cached, self.cached_len = positions.detach(), t
        return x * positions


@repro("bs-roformer / mel-band-roformer: view_as_complex(stft_repr) * mask, then einops.rearrange before istft")
class EinopsOnComplex(nn.Module):
    def forward(self, x):
        from einops import rearrange  # einops is in the test env (the zoo's extra)
        spec = torch.stft(x, 16, hop_length=4, window=torch.hann_window(16), return_complex=True)
        spec = torch.view_as_complex(torch.view_as_real(spec))
        spec = rearrange(spec, "b f t -> b f t")
        return torch.view_as_real(spec).flatten(-2)


def _export(model, x, exporter: str) -> onnx.ModelProto:
    axes = {0: "batch", x.dim() - 1: "time"}
    if exporter == "torchscript":
        buf = io.BytesIO()
        torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": axes})
        return onnx.load_from_string(buf.getvalue())
    dims = {a: torch.export.Dim(n, min=1) for a, n in axes.items()}
    return torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=(dims,), input_names=["x"],
                             output_names=["y"]).model_proto


@contextlib.contextmanager
def _silenced_fds():
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def outcome(name: str, exporter: str, patches: bool) -> str:
    """"ok", "wrong at B=1/T={x_new.shape[-1]}: ..." or "export fails: <first line>"."""
    r = REPROS[name]
    model = r.module().eval()
    x, x_new = r.example(3, 37), r.example(1, 53 if r.warm else 23)
    if r.warm:
        with torch.no_grad():
            model(x)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            stack.enter_context(_silenced_fds())  # the TorchScript exporter prints its graph from C++
            if patches:
                stack.enter_context(onnx_compat.patched())
            proto = _export(model, x, exporter)
    except Exception as exc:
        while exc.__cause__ is not None and type(exc).__name__ in ("TorchExportError", "ConversionError"):
            exc = exc.__cause__
        return f"export fails: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:140]}"
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # the failure is reported below, once
        got = ort.InferenceSession(proto.SerializeToString(), options).run(None, {"x": x_new.numpy()})[0]
    except Exception as exc:  # the graph froze a dim, or a Reshape the example's sizes
        message = str(exc).split("Status Message: ")[-1].strip().splitlines()[0]
        message = re.sub(r"^\S+\.(cc|h):\d+ (\S+\(.*?\) )?", "", message)
        return f"ONNX Runtime fails at B=1/T={x_new.shape[-1]}: {message[:140]}"
    with torch.no_grad():
        expected = model(x_new).numpy()
    if got.shape != expected.shape:
        return f"wrong at B=1/T={x_new.shape[-1]}: shape {list(got.shape)}, eager {list(expected.shape)}"
    if not np.allclose(got, expected, atol=1e-4, rtol=1e-3):
        return f"wrong at B=1/T={x_new.shape[-1]}: max abs err {np.abs(got - expected).max():.3g}"
    return "ok"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="patterns whose name contains this (repeatable)")
    args = parser.parse_args(argv)
    names = [n for n in REPROS if not args.only or any(o.lower() in n.lower() for o in args.only)]
    for name in names:
        print(f"{name}  ({REPROS[name].where})")
        for exporter in ("torchscript", "dynamo"):
            for patches in (False, True):
                label = f"{'patched' if patches else 'vanilla'} {exporter}"
                print(f"    {label:20s} {outcome(name, exporter, patches)}", flush=True)


if __name__ == "__main__":
    main()
