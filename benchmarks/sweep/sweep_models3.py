"""The sweep's third round (issue #47, Deliver 4): sequence models beyond speech -- OCR line recognisers,
time-series models, NLP taggers and language models -- from libraries that neither earlier round nor the
tests use.

Same rules as ``sweep_models.py``: a tiny config of each library's main models, random init (or the
weights the package itself ships), no download at run time; wrappers only adapt I/O (lengths in, a
tuple or dict out). Registered with ``round=3`` so ``sweep.py --round 3`` runs and writes them apart
from the earlier rounds. The speech, music and state-space models of round three are in
``sweep_models3b.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from onnx_compat import Dim, TensorSpec
from sweep_models import B, Seeded, _job, _manual, entry, feats, out, wave  # noqa: F401


def _r3(library: str, kind: str):
    return entry(library, kind, round=3)


def _adapter(model, fn, *names):
    """``fn(model, *inputs)`` with the job's inputs in spec order (lengths right after their tensor): the adapter
    a user writes when a library's forward takes more than ``data[, lengths]`` (a dict, a mask, tags). One class
    per arity, named arguments: torch.export matches ``dynamic_shapes`` to the signature."""
    return {2: _Two, 3: _Three, 4: _Four}[len(names)](model, fn)


class _Two(nn.Module):
    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, data, other):
        return self.fn(self.model, data, other)


class _Three(_Two):
    def forward(self, data, other, third):
        return self.fn(self.model, data, other, third)


class _Four(_Two):
    def forward(self, data, other, third, fourth):
        return self.fn(self.model, data, other, third, fourth)


# ---------------------------------------------------------------- kraken: VGSL text-line recognisers (OCR/HTR)

def _kraken(spec: str, classes: int = 20):
    """A line image ``[B, 1, H=32, W]`` with its widths, as kraken's TorchSeqRecognizer feeds its network
    (``nn(line, lens)``); out: class scores ``[B, classes, 1, W']`` and their widths for CTC decoding."""
    _manual()
    from kraken.lib.vgsl import TorchVGSLModel
    model = TorchVGSLModel(spec.replace("OUT", f"O1c{classes}")).nn
    width = Dim("width", min=24, example=96)
    inputs = [TensorSpec("data", [B, 1, 32, width], lengths=[3], lengths_dtype=torch.int64)]
    return _job(Seeded(model, lambda m, x, n: m(x, n)), inputs, out(classes, 1, "frames", lengths=[3]))


@_r3("kraken", "ocr")
def kraken_vgsl_lstm():
    """kraken's default recogniser shape, small: conv/pool stack, height folded into channels, BiLSTM, softmax."""
    return _kraken("[1,32,0,1 Cr3,3,16 Mp2,2 Cr3,3,32 Mp2,2 S1(1x0)1,3 Lbx32 Do0.1,2 Lbx32 OUT]")


@_r3("kraken", "ocr")
def kraken_vgsl_gru_groupnorm():
    return _kraken("[1,32,0,1 Cr3,3,16 Gn8 Mp2,2 Cr3,3,32 Gn8 Mp2,2 S1(1x0)1,3 Gbx32 OUT]")


@_r3("kraken", "ocr")
def kraken_vgsl_ysummarize():
    """Height collapsed by an LSTM over y (``Lfys``) instead of a reshape, then a BiLSTM over x."""
    return _kraken("[1,32,0,1 Cr3,3,16 Mp2,2 Lfys16 Lbx32 OUT]")


# ---------------------------------------------------------------- pypots: imputation of partially observed series

def _pypots(cls_name: str, **kw):
    """The model core a trained ``pypots.imputation.X`` holds (``.model``), fed the dict its data loader builds:
    values with missing entries zeroed and the observation mask. ``n_steps`` is a constructor constant in pypots,
    so the series length is fixed; the batch is dynamic."""
    _manual()
    import contextlib
    import io
    import tempfile
    # pypots imports ai4ts, whose import banner calls sys.stdout.encoding.lower(): None under a captured stdout
    with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO(), encoding="utf-8")):
        import pypots.imputation as pi
    wrapper = getattr(pi, cls_name)(n_steps=24, n_features=5, epochs=1, device="cpu",
                                    saving_path=tempfile.mkdtemp(prefix="pypots"), verbose=False, **kw)
    return wrapper.model


def _series(features=5, steps=24):
    return [TensorSpec("data", [B, steps, features]),
            TensorSpec("mask", [B, steps, features], dtype=torch.int64, values=(0, 2))]


def _impute(m, x, mask):
    mask = mask.float()
    return m({"X": x * mask, "missing_mask": mask})["imputation"]


@_r3("pypots", "time-series")
def pypots_saits():
    model = _pypots("SAITS", n_layers=1, d_model=16, n_heads=2, d_k=8, d_v=8, d_ffn=32)
    return _job(_adapter(model, _impute, "data", "mask"), _series(), out(24, 5))


@_r3("pypots", "time-series")
def pypots_transformer():
    model = _pypots("Transformer", n_layers=1, d_model=16, n_heads=2, d_k=8, d_v=8, d_ffn=32)
    return _job(_adapter(model, _impute, "data", "mask"), _series(), out(24, 5))


@_r3("pypots", "time-series")
def pypots_timesnet():
    """TimesNet: FFT of the series, its top-k periods pick how the 1D series folds into 2D for the conv blocks."""
    model = _pypots("TimesNet", n_layers=1, top_k=2, d_model=16, d_ffn=16, n_kernels=3)
    return _job(_adapter(model, _impute, "data", "mask"), _series(), out(24, 5))


def _deltas(mask):
    """Time since each feature was last observed (BRITS' deltas, as pypots' data loader computes them)."""
    steps = mask.shape[1]
    gap = torch.ones_like(mask)
    gap[:, 0] = 0
    out_ = [gap[:, 0]]
    for t in range(1, steps):
        out_.append(gap[:, t] + (1 - mask[:, t - 1]) * out_[-1])
    return torch.stack(out_, 1)


@_r3("pypots", "time-series")
def pypots_brits():
    """BRITS: two recurrent imputers, one per direction, stepped in a Python loop over ``n_steps``."""
    model = _pypots("BRITS", rnn_hidden_size=16)

    def impute(m, x, mask):
        mask = mask.float()
        x = x * mask
        back = mask.flip(1)
        inputs = {"forward": {"X": x, "missing_mask": mask, "deltas": _deltas(mask)},
                  "backward": {"X": x.flip(1), "missing_mask": back, "deltas": _deltas(back)}}
        return m(inputs)["imputation"]
    return _job(_adapter(model, impute, "data", "mask"), _series(), out(24, 5))


# ---------------------------------------------------------------- gluonts (torch): probabilistic forecasters

def _forecast_out(names, horizon):
    return [TensorSpec(n, [B, horizon]) for n in names]


@_r3("gluonts", "time-series")
def gluonts_patchtst():
    """PatchTST's network: mean-scaled past target cut into patches, a transformer, Student-t parameters."""
    _manual()
    from gluonts.torch.model.patch_tst.module import PatchTSTModel
    model = PatchTSTModel(prediction_length=4, context_length=32, patch_len=8, stride=4, padding_patch="end",
                          d_model=16, nhead=2, dim_feedforward=32, num_feat_dynamic_real=0, dropout=0.0,
                          activation="relu", norm_first=False, num_encoder_layers=1, scaling="mean")
    inputs = [TensorSpec("data", [B, 32]), TensorSpec("observed", [B, 32], dtype=torch.int64, values=(0, 2))]
    return _job(_adapter(model, lambda m, x, o: m(x, o.float())[0], "data", "observed"), inputs,
                _forecast_out(("df", "loc", "scale"), 4))


@_r3("gluonts", "time-series")
def gluonts_tft():
    """Temporal Fusion Transformer: variable selection networks, an LSTM encoder/decoder, attention, quantiles."""
    _manual()
    from gluonts.torch.model.tft.module import TemporalFusionTransformerModel
    model = TemporalFusionTransformerModel(context_length=32, prediction_length=4, d_feat_static_real=[1],
                                           c_feat_static_cat=[3], d_feat_dynamic_real=[2], num_heads=2,
                                           d_hidden=16, d_var=8, dropout_rate=0.0)
    inputs = [TensorSpec("data", [B, 32]), TensorSpec("observed", [B, 32], dtype=torch.int64, values=(0, 2)),
              TensorSpec("static_cat", [B, 1], dtype=torch.int64, values=(0, 3)),
              TensorSpec("dynamic_real", [B, 36, 2])]

    def forecast(m, x, o, cat, dyn):
        return m(x, o.float(), torch.ones(x.shape[0], 1), cat, dyn)[0][0]
    return _job(_adapter(model, forecast, "data", "observed", "static_cat", "dynamic_real"), inputs,
                [TensorSpec("output", [B, 4, len(model.distr_output.quantiles)])])


@_r3("gluonts", "time-series")
def gluonts_deepar():
    """DeepAR's teacher-forced pass (what its loss and its first sampling step run): lagged targets into an
    LSTM, Student-t parameters per step. Its ``forward`` samples, which no two runtimes reproduce."""
    _manual()
    from gluonts.torch.model.deepar.module import DeepARModel
    model = DeepARModel(freq="h", context_length=24, prediction_length=4, num_feat_dynamic_real=1,
                        num_feat_static_real=1, num_feat_static_cat=1, cardinality=[3], num_layers=1,
                        hidden_size=16, dropout_rate=0.0, lags_seq=[1, 2, 3, 24])
    past = model._past_length
    inputs = [TensorSpec("data", [B, past]), TensorSpec("observed", [B, past], dtype=torch.int64, values=(0, 2)),
              TensorSpec("static_cat", [B, 1], dtype=torch.int64, values=(0, 3)),
              TensorSpec("time_feat", [B, past + 4, 1])]

    def params(m, x, o, cat, feat):
        static_real = torch.ones(x.shape[0], 1)
        return m.unroll_lagged_rnn(cat, static_real, feat[:, :past], x, o.float(), feat[:, past:],
                                   x[:, -4:])[0]
    return _job(_adapter(model, params, "data", "observed", "static_cat", "time_feat"), inputs,
                [TensorSpec(n, [B, 24 - 1 + 4]) for n in ("df", "loc", "scale")])  # context - 1 + horizon steps


# ---------------------------------------------------------------- iTransformer: variates as tokens

@_r3("itransformer", "time-series")
def itransformer():
    _manual()
    from iTransformer import iTransformer
    model = iTransformer(num_variates=5, lookback_len=32, depth=1, dim=16, heads=2, dim_head=8, pred_length=4,
                         num_tokens_per_variate=1, use_reversible_instance_norm=True)
    return _job(Seeded(model, lambda m, x: m(x)), [TensorSpec("data", [B, 32, 5])], out(4, 5))


@_r3("itransformer", "time-series")
def itransformer_2d():
    """iTransformer2D: each variate also cut into time tokens, attention across time and across variates."""
    _manual()
    from iTransformer import iTransformer2D
    model = iTransformer2D(num_variates=5, lookback_len=32, num_time_tokens=4, depth=1, dim=16, heads=2,
                           dim_head=8, pred_length=4, use_reversible_instance_norm=True)
    return _job(Seeded(model, lambda m, x: m(x)[4]), [TensorSpec("data", [B, 32, 5])], out(4, 5))


# ---------------------------------------------------------------- stanza: character language model (packed LSTM)

@_r3("stanza", "lm")
def stanza_charlm():
    """Stanza's character LM (what its taggers use as contextual embeddings): packed sequences through its
    PackedLSTM. pack_padded_sequence wants lengths longest first, so the adapter sorts the batch and
    unsorts the result, as stanza's own callers do."""
    _manual()
    from stanza.models.common.char_model import CharacterLanguageModel
    args = dict(char_emb_dim=16, char_hidden_dim=32, char_num_layers=1, char_dropout=0.0, char_rec_dropout=0.0,
                char_unit_dropout=0.0)
    model = CharacterLanguageModel(args, {"char": list(range(30))})

    def decode(m, chars, lengths):
        order = torch.argsort(lengths, descending=True)
        _, _, logits = m(chars[order], lengths[order].cpu())
        return logits[torch.argsort(order)], lengths
    time = Dim("chars", min=4, example=19)
    inputs = [TensorSpec("data", [B, time], dtype=torch.int64, lengths=[1], lengths_dtype=torch.int64,
                         values=(1, 30))]
    return _job(Seeded(model, decode), inputs, out("chars", 30, lengths=[1]))


# ---------------------------------------------------------------- pytorch-crf: linear-chain CRF

def _emissions(tags=5, extra=()):
    time = Dim("tokens", min=3, example=11)
    return [TensorSpec("data", [B, time, tags], lengths=[1], lengths_dtype=torch.int64)] + list(extra)


@_r3("pytorch-crf", "tagger")
def torchcrf_log_likelihood():
    """The CRF's training score: log-likelihood of given tag paths under a length mask."""
    _manual()
    from torchcrf import CRF
    model = CRF(5, batch_first=True)
    time = Dim("tokens", min=3, example=11)
    inputs = [TensorSpec("data", [B, time, 5], lengths=[1], lengths_dtype=torch.int64),
              TensorSpec("tags", [B, time], dtype=torch.int64, values=(0, 5))]

    def score(m, emissions, lengths, tags):
        mask = torch.arange(emissions.shape[1])[None, :] < lengths[:, None]
        return m(emissions, tags, mask, reduction="none")
    return _job(_adapter(model, score, "data", "lengths", "tags"), inputs, [TensorSpec("output", [B])])


@_r3("pytorch-crf", "tagger")
def torchcrf_viterbi():
    """Viterbi decoding; ``decode`` returns Python lists of tags, padded back into a tensor as a caller does."""
    _manual()
    from torchcrf import CRF
    model = CRF(5, batch_first=True)

    def decode(m, emissions, lengths):
        mask = torch.arange(emissions.shape[1])[None, :] < lengths[:, None]
        paths = m.decode(emissions, mask)
        return nn.utils.rnn.pad_sequence([torch.tensor(p) for p in paths], batch_first=True)
    return _job(Seeded(model, decode), _emissions(),
                [TensorSpec("output", [B, Dim("tokens")], dtype=torch.int64)])


# ---------------------------------------------------------------- torch-struct: structured distributions

def _potentials(last=5, square=True):
    time = Dim("tokens", min=3, example=11)
    dims = [B, time, last, last] if square else [B, time, time]
    return [TensorSpec("data", dims, lengths=[1], lengths_dtype=torch.int64)]


@_r3("torch-struct", "tagger")
def struct_linear_chain_partition():
    """Log partition of a linear-chain CRF over ``[B, N-1, C, C]`` edge potentials (a log-semiring scan)."""
    from torch_struct import LinearChainCRF
    return _job(Seeded(nn.Identity(), lambda m, x, n: LinearChainCRF(m(x), lengths=n + 1).partition),
                _potentials(), [TensorSpec("output", [B])])


@_r3("torch-struct", "tagger")
def struct_linear_chain_marginals():
    """Edge marginals of the same CRF (autograd of the partition, as torch-struct computes them)."""
    from torch_struct import LinearChainCRF
    return _job(Seeded(nn.Identity(), lambda m, x, n: LinearChainCRF(m(x), lengths=n + 1).marginals),
                _potentials(), [TensorSpec("output", [B, Dim("tokens"), 5, 5])])


@_r3("torch-struct", "parser")
def struct_dependency_partition():
    """A non-projective dependency CRF's log partition (matrix-tree theorem: a log-determinant of the
    Laplacian) over ``[B, N, N]`` arc scores."""
    from torch_struct import NonProjectiveDependencyCRF
    return _job(Seeded(nn.Identity(), lambda m, x, n: NonProjectiveDependencyCRF(m(x), lengths=n).partition),
                _potentials(square=False), [TensorSpec("output", [B])])
