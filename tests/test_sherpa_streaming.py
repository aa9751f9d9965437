"""sherpa-onnx's streaming NeMo CTC contract: ``export_streaming(..., contract="sherpa-onnx/online-nemo-ctc")``.

The bundled cache-aware streaming Conformer CTC (``models/streaming_ctc.py``, NeMo's layout) is exported with its
three caches declared as ``StateSpec``s; the metadata sherpa-onnx reads comes from those declarations, and the stream
is decoded inside sherpa-onnx -- its Python ``OnlineRecognizer`` (four utterances as one batch) and its native
streaming binary -- to exactly the tokens of PyTorch's own streamed greedy decode, with both exporters. Every bad
input of issue #38 for this contract is one ``ContractError`` with nothing written.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

from onnx_compat.contracts import ContractError, frontends
from onnx_compat.contracts.consumers import greedy_ctc
from onnx_compat.contracts.sherpa_stream_consumers import StreamJob, streamed_log_probs
from onnx_compat.models.streaming_ctc import CacheAwareConformerCTC, streaming_ctc_job
from onnx_compat.streaming import StateSpec, export_streaming
from onnx_compat.streaming.probe import run_step
from onnx_compat.streaming.states import StateLayout
from onnx_compat.streaming.step import StepModule
from helpers import EXPORTERS

ONLINE = "sherpa-onnx/online-nemo-ctc"


def _export(folder, exporter="torchscript", **change):
    job = {**streaming_ctc_job(), "contract": ONLINE, **change}
    return export_streaming(path=str(folder / "model.onnx"), exporter=exporter, **job)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_streaming_ctc_decodes_in_sherpa_onnx_like_pytorch(exporter, tmp_path):
    """Python OnlineRecognizer (batched) and the native binary give PyTorch's streamed tokens exactly, on four
    utterances, one of them shorter than two chunks; the metadata is the StateSpecs' dims, tokens.txt beside."""
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")
    report = _export(tmp_path, exporter)
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "model.onnx")).metadata_props}
    job = streaming_ctc_job()
    channel, time_cache = job["states"][0].dims, job["states"][1].dims
    assert {k: meta[k] for k in report.contract["metadata"]} == report.contract["metadata"]
    assert [meta[f"cache_last_channel_dim{a}"] for a in (1, 2, 3)] == [str(d) for d in channel[1:]]
    assert [meta[f"cache_last_time_dim{a}"] for a in (1, 2, 3)] == [str(d) for d in time_cache[1:]]
    assert (meta["window_size"], meta["chunk_shift"], meta["subsampling_factor"], meta["vocab_size"]) == \
        (str(job["chunk"]), str(job["shift"]), "4", "16")
    assert (tmp_path / "tokens.txt").read_text().splitlines()[-1] == "<blk> 16"
    checks = report.contract["consumer_checks"]
    assert [c.get("skipped") for c in checks] == [None, None], checks  # both consumers ran
    for check in checks:
        assert check["ok"] and check["calls"][0] == 1 and min(check["calls"][1:]) >= 5, check
        assert min(check["tokens"]) >= 2, f"degenerate decode, nothing compared: {check}"


def test_the_comparison_sees_the_states():
    """The reference is not blind to the caches: decoding with them zeroed every call gives other tokens, so the
    consumers' equality above means sherpa-onnx carried the states as PyTorch did."""
    job = streaming_ctc_job()
    model, layout = job["step"], StateLayout(job["states"])
    step = StepModule(model, job["inputs"], layout)
    carried = StreamJob(step, job["inputs"], job["outputs"], lambda b: layout.initial({"batch": b}, None, b), run_step)
    samples = frontends.utterances((2.1,), seed=1)[0]
    features = frontends.nemo_ctc_features(samples, model.features, "NA")
    with_states = np.concatenate(streamed_log_probs(carried, features, model.window, model.shift))
    zeroed = [streamed_log_probs(carried, features[start:start + model.window + 1], model.window, model.shift)[0]
              for start in range(0, features.shape[0] - model.window, model.shift)]
    blank = len(job["vocabulary"]) - 1
    tokens = greedy_ctc(with_states, len(with_states), blank)
    assert len(tokens) >= 10 and tokens != greedy_ctc(np.concatenate(zeroed), len(with_states), blank)


def _states(order=(0, 1, 2), len_dtype=torch.int64):
    job = streaming_ctc_job()
    states = list(job["states"])
    states[2] = StateSpec(states[2].name, states[2].dims, len_dtype)
    return [states[k] for k in order]


class _FewerValidFrames(CacheAwareConformerCTC):
    """Says one frame fewer is valid than it emits: sherpa-onnx never reads output 1 and decodes them all."""

    def forward(self, *args):
        out = super().forward(*args)
        return (out[0], out[1] - 1, *out[2:])


@pytest.mark.parametrize("change, what, got", [
    ({"states": _states((1, 0, 2))}, "states order", "['cache_last_time', 'cache_last_channel', "
     "'cache_last_channel_len']"),
    ({"states": _states(len_dtype=torch.int32)}, "input 4 (cache_last_channel_len) 'cache_last_channel_len'",
     "int32 of rank 1"),
    ({"states": _states((0, 1))}, "inputs", "4 ['audio_signal', 'audio_signal:size2', 'cache_last_channel', "
     "'cache_last_time']"),
    ({"vocabulary": [f"t{i}" for i in range(16)] + ["blank"]}, "vocabulary blank", "none"),
    ({"vocabulary": [f"t{i}" for i in range(15)] + ["<blk>"]}, "vocabulary", "16"),
    ({"vocabulary": None}, "vocabulary", "none (vocabulary=[...])"),
])
def test_bad_declarations_are_refused_before_anything_runs(change, what, got, tmp_path):
    with pytest.raises(ContractError) as err:
        _export(tmp_path, **change)
    assert (err.value.what, err.value.got) == (what, got), err.value
    assert os.listdir(tmp_path) == []


def test_outputs_must_leave_output_1_to_be_skipped(tmp_path):
    """Without the frame count output sherpa-onnx would skip the first cache and shift every state by one."""
    from onnx_compat import Dim, TensorSpec
    outputs = [TensorSpec("log_probs", [Dim("batch"), Dim("frames"), 17])]
    with pytest.raises(ContractError) as err:
        _export(tmp_path, outputs=outputs)
    assert "outputs before the states: expected exactly 2" in str(err.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change, what, got", [
    ({"step": _FewerValidFrames().eval()}, "output 1 (frame count)", "3"),
    ({"metadata": {"window_size": "20"}}, "metadata 'window_size'", "'20'"),
    ({"metadata": {"subsampling_factor": "8"}}, "output 0 frames per call",
     "4 (measured: one call on window_size=19 feature frames)"),
    ({"metadata": {"subsampling_factor": "four"}}, "metadata 'subsampling_factor' (feature frames per output frame)",
     "'four'"),
])
def test_graphs_sherpa_onnx_would_misread_are_refused_before_writing(change, what, got, tmp_path):
    """Checked on the exported graph (it ran and streamed in ONNX Runtime), refused before the rename."""
    with pytest.raises(ContractError) as err:
        _export(tmp_path, **change)
    assert (err.value.what, err.value.got) == (what, got), err.value
    assert os.listdir(tmp_path) == []  # not the model, not tokens.txt, not the temporary folder


def test_unknown_streaming_contract(tmp_path):
    """Refused before anything runs, listing every contract (the transducers' and export()'s too)."""
    from onnx_compat.errors import ArgumentError
    with pytest.raises(ArgumentError, match="online-nemo-ctc.*export_transducer: 'sherpa-onnx/offline-transducer'"):
        _export(tmp_path, contract="sherpa-onnx/online-wenet")
    assert os.listdir(tmp_path) == []


def test_a_shift_the_frames_do_not_fit_says_what_to_change(tmp_path):
    """shift=7 once read "expected chunk_shift / subsampling_factor = 7 / 1 ..., got 4": the finding now says what
    was declared (shift=, the factor derived from it), what was measured (the frames of one call) and the value to
    change."""
    with pytest.raises(ContractError) as err:
        _export(tmp_path, shift=7)
    assert (err.value.what, err.value.expected, err.value.got) == (
        "output 0 frames per call", "7 (shift=7 declared / subsampling_factor=1, derived as shift // frames = 7 // 4)",
        "4 (measured: one call on window_size=19 feature frames)"), err.value
    assert err.value.fix.startswith("shift=16: ") and "to fix: shift=16" in str(err.value), err.value
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shift, metadata, expected, fix", [
    (16, {"subsampling_factor": "8"}, "2 (shift=16 declared / subsampling_factor=8, given in metadata)",
     "subsampling_factor=4, or leave it out"),
    (9, {}, "4.5 (shift=9 declared / subsampling_factor=2, derived as shift // frames = 9 // 4)", "shift=16: "),
    (3, {}, "3 (shift=3 declared / subsampling_factor=1, derived as shift // frames = 3 // 4)", "shift=16: "),
])
def test_the_shift_finding_for_each_way_it_misses(shift, metadata, expected, fix):
    """On the frames of one call alone (4 from window_size 19, as the bundled model): a factor given that does not
    fit, or a shift no factor fits; a shift that is a multiple of the frames is accepted (24: a factor of 6)."""
    from onnx_compat.contracts.base import Context
    from onnx_compat.contracts.sherpa_streaming import ONLINE_NEMO_CTC, frames_are_what_sherpa_reads

    def context(shift, metadata):
        ctx = Context(None, [], [], {}, options={"window_size": 19, "chunk_shift": shift},
                      cache={"frames": (4, None, 17)})
        ctx.metadata.update({"chunk_shift": str(shift), **metadata})
        ctx.metadata.setdefault("subsampling_factor", next(k for k in ONLINE_NEMO_CTC.metadata
                                                           if k.key == "subsampling_factor").derive(ctx))
        return ctx
    (found,) = frames_are_what_sherpa_reads(context(shift, metadata))
    assert (found.expected, found.got) == (expected, "4 (measured: one call on window_size=19 feature frames)")
    assert found.fix.startswith(fix), found
    assert frames_are_what_sherpa_reads(context(16, {})) == frames_are_what_sherpa_reads(context(24, {})) == []


def test_what_the_derived_cache_dims_prevent(tmp_path):
    """The cache dims sherpa-onnx builds its initial states from, typed the wrong way round (time's for channel's:
    what hand-stringified metadata invites), make the recognizer process fail on the first chunk."""
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    from onnx_compat.contracts import ConsumerMismatch
    from onnx_compat.contracts.consumers import run_child
    from onnx_compat.contracts.sherpa_stream_consumers import _ONLINE
    _export(tmp_path)
    proto = onnx.load(str(tmp_path / "model.onnx"))
    meta = {p.key: p for p in proto.metadata_props}
    for a in (1, 2, 3):
        channel, time_cache = meta[f"cache_last_channel_dim{a}"], meta[f"cache_last_time_dim{a}"]
        channel.value, time_cache.value = time_cache.value, channel.value
    onnx.save(proto, str(tmp_path / "swapped.onnx"))
    wav = str(tmp_path / "a.wav")
    frontends.write_wav(wav, frontends.utterances((1.0,), seed=1)[0])
    with pytest.raises(ConsumerMismatch, match="exit code"):
        run_child(_ONLINE, [str(tmp_path / "swapped.onnx"), str(tmp_path / "tokens.txt"), "80", "16000", wav],
                  "sherpa-onnx")


def test_a_fixed_window_declared_as_such_decodes_too(tmp_path):
    """sherpa-onnx always feeds window_size frames: a window declared as that int (its count a separate int64
    input, the outputs' frames an int too) is the same contract, and decodes like PyTorch."""
    pytest.importorskip("sherpa_onnx", reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
    pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is not installed")
    from onnx_compat import Dim, TensorSpec
    job = streaming_ctc_job()
    model, batch = job["step"], Dim("batch")
    report = _export(tmp_path, inputs=[TensorSpec("audio_signal", [batch, 80, model.window]),
                                       TensorSpec("length", [batch], torch.int64, values=(model.window,
                                                                                          model.window + 1))],
                     outputs=[TensorSpec("log_probs", [batch, model.chunk, 17]),
                              TensorSpec("log_probs_len", [batch], torch.int64)])
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    assert graph.input[0].type.tensor_type.shape.dim[2].dim_value == model.window
    assert [c["ok"] for c in report.contract["consumer_checks"]] == [True, True], report.contract
