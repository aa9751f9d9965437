"""Issue #45's findings on the consumer contracts: a batch mismatch that names its cause, and contract names.

Finding 11: an encoder that does not mask its padding decodes like PyTorch one utterance at a time and
differently in sherpa-onnx's padded batch; the mismatch now says so ("padding"), after decoding each utterance
again alone, with the tokens of those runs as a field. Finding 14 (part): an unknown contract name is answered
with every contract there is, whichever entry point was called.
"""
from __future__ import annotations

import os

import onnx
import pytest
import torch
from torch import nn

from onnx_compat import export
from onnx_compat.contracts import CONTRACTS, ConsumerMismatch, ContractError, apply_contract, get_contract
from onnx_compat.contracts import names
from onnx_compat.contracts.sherpa_consumers import NemoCtcPython
from onnx_compat.contracts.sherpa_runs import judged
from onnx_compat.contracts.sherpa_streaming import STREAMING_CONTRACTS, streaming_contract
from onnx_compat.contracts.sherpa_transducer import TRANSDUCER_CONTRACTS, transducer_contract
from onnx_compat.errors import ArgumentError
import consumer_models as cm

NEMO = "sherpa-onnx/nemo-ctc"


class CenteredCtc(nn.Module):
    """features [N, C, T], lengths [N] -> log-probs [N, T // 4, V], lengths // 4: the features centred on their mean
    over time, then one strided convolution. ``masked=False`` takes the mean over the whole padded time axis (the
    padding the consumer adds moves every frame of a shorter utterance); ``masked=True`` over the item's own
    frames, as its lengths say."""

    def __init__(self, masked: bool, features: int = 20, classes: int = 12):
        super().__init__()
        torch.manual_seed(0)
        self.masked, self.proj = masked, nn.Conv1d(features, classes, kernel_size=4, stride=4)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor):
        if self.masked:
            keep = (torch.arange(features.shape[2])[None, :] < lengths[:, None]).to(features.dtype)[:, None, :]
            mean = (features * keep).sum(2, keepdim=True) / lengths.to(features.dtype)[:, None, None]
        else:
            mean = features.mean(dim=2, keepdim=True)
        log_probs = self.proj(features - mean).transpose(1, 2).log_softmax(-1)
        return log_probs, torch.div(lengths, 4, rounding_mode="floor")


def _in_sherpa(model, tmp_path):
    """The model written under the NeMo CTC contract (TorchScript, verified) and decoded in sherpa-onnx's Python
    recognizer: four utterances of different lengths in one padded batch."""
    inputs, outputs = cm.nemo_specs()
    tmp_path.mkdir()
    path = str(tmp_path / "model.onnx")
    export(model, path, inputs, outputs, exporter="torchscript")
    proto = onnx.load(path)
    applied = apply_contract(NEMO, proto, inputs, outputs, vocabulary=cm.vocabulary(),
                             metadata={"normalize_type": "NA"})
    return applied.verify_in_consumer(proto, model, inputs, only=[NemoCtcPython().name])


def test_a_batch_mismatch_from_unmasked_padding_says_padding(tmp_path):
    """Each utterance decoded alone gives PyTorch's tokens, the padded batch does not: the mismatch says
    "padding", with what the lone runs decoded; the same model masking by its lengths decodes in the batch."""
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("kaldi_native_fbank")
    with pytest.raises(ConsumerMismatch) as caught:
        _in_sherpa(CenteredCtc(masked=False).eval(), tmp_path / "unmasked")
    mismatch = caught.value
    assert mismatch.cause == "padding", mismatch
    expected = NemoCtcPython().reference(CenteredCtc(masked=False).eval(), cm.nemo_specs()[0], _Applied(),
                                         cm.vocabulary(), 16000)[0]
    assert mismatch.alone == expected and min(len(t) for t in expected) >= 3, (mismatch.alone, expected)
    assert mismatch.got != mismatch.expected == expected[mismatch.case]
    text = str(mismatch)
    assert "in a batch of 4" in text and "padding: the model's output depends on the padding of the batch: each " \
        "utterance alone matches PyTorch" in text, text
    (masked,) = _in_sherpa(CenteredCtc(masked=True).eval(), tmp_path / "masked")
    assert masked["ok"] and masked["utterances"] == 4 and min(masked["tokens"]) >= 3, masked


class _Applied:
    """What ``NemoCtcPython.reference`` reads of an applied contract."""

    metadata = {"normalize_type": "NA"}
    io = {"inputs": [{"dims": ["batch", 20, "time"]}]}


def _consumer(batched, alone):
    """A stand-in consumer: ``batched`` for a batch of several, ``alone[k]`` for utterance k decoded by itself."""
    calls = []

    def command(wavs):
        calls.append(list(wavs))
        return batched if len(wavs) == len(batched) else [alone[int(wavs[0])]]
    return command, calls


def test_the_lone_runs_decide_the_cause():
    """Only a mismatch that every lone run clears is blamed on the batch; one that persists alone is named as
    such, with no cause; a batch of one is not run again."""
    want = [["a", "b"], ["c"], ["d", "e"]]
    command, calls = _consumer([["a", "b"], ["x"], ["d", "e"]], want)
    with pytest.raises(ConsumerMismatch) as caught:
        judged("c", want, command, ["0", "1", "2"], lambda k: f" (utterance {k})")
    assert (caught.value.cause, caught.value.case, caught.value.alone) == ("padding", 1, want), caught.value
    assert calls == [["0", "1", "2"], ["0"], ["1"], ["2"]]
    with pytest.raises(ConsumerMismatch) as caught:
        judged("c", want, _consumer([["a", "b"], ["x"], ["d", "e"]], want)[0], ["0", "1", "2"], batch="batch")
    assert caught.value.cause == "batch" and "the other streams of the batch" in str(caught.value)
    wrong_alone = [["a", "b"], ["x"], ["d", "e"]]
    with pytest.raises(ConsumerMismatch) as caught:
        judged("c", want, _consumer(wrong_alone, wrong_alone)[0], ["0", "1", "2"])
    assert caught.value.cause is None and caught.value.alone == wrong_alone, caught.value
    assert "it differs alone too: not the batch" in str(caught.value)
    command, calls = _consumer([["x"]], want)
    with pytest.raises(ConsumerMismatch) as caught:
        judged("c", want[:1], command, ["0"])
    assert caught.value.cause is None and caught.value.alone is None and calls == [["0"]]
    assert judged("c", want, _consumer(want, want)[0], ["0", "1", "2"])["ok"]


def test_the_names_table_is_every_contract_with_its_entry_point():
    """``names.CALLS`` is the contract objects' names, each with the function that writes it."""
    from onnx_compat.contracts import sherpa_nemo_transducer, sherpa_paraformer, sherpa_sense_voice, sherpa_whisper
    from onnx_compat.contracts import sherpa_tts
    by_entry = {"export": [c.name for c in CONTRACTS], "export_streaming": [c.name for c in STREAMING_CONTRACTS],
                "export_transducer": [c.name for c in TRANSDUCER_CONTRACTS], "export_whisper": [sherpa_whisper.NAME],
                "export_sense_voice": [sherpa_sense_voice.NAME], "export_paraformer": [sherpa_paraformer.NAME],
                "export_nemo_transducer": [sherpa_nemo_transducer.NAME], "export_vits": [sherpa_tts.VITS],
                "export_matcha": [sherpa_tts.MATCHA]}
    assert {name: entry for entry, group in by_entry.items() for name in group} == \
        {name: names.entry_point(name) for name in names.CALLS}
    assert set(names.WRITES) == set(by_entry)


@pytest.mark.parametrize("lookup, here", [(get_contract, "export"), (streaming_contract, "export_streaming"),
                                          (transducer_contract, "export_transducer")])
def test_an_unknown_contract_lists_every_contract(lookup, here):
    """Each entry point answered an unknown name with its own contracts only (export's three, not the streaming
    one or the transducers): now every name, by the call that writes it, as an ``ArgumentError``."""
    with pytest.raises(ArgumentError) as caught:
        lookup("sherpa-onnx/kaldi")
    assert (caught.value.argument, caught.value.value) == ("contract", "sherpa-onnx/kaldi")
    text = str(caught.value)
    assert all(repr(name) in text for name in names.CALLS), text
    assert "export_streaming: 'sherpa-onnx/online-nemo-ctc'" in text and "export_transducer: " in text, text
    elsewhere = next(name for name in names.CALLS if names.entry_point(name) != here)
    with pytest.raises(ContractError) as caught:
        lookup(elsewhere)
    assert caught.value.what == "entry point" and caught.value.expected == names.CALLS[elsewhere], caught.value
    assert caught.value.got.startswith(f"{here}(...)")


def test_export_refuses_an_unknown_contract_before_anything_runs(tmp_path):
    inputs, outputs = cm.nemo_specs()
    with pytest.raises(ArgumentError, match="'sherpa-onnx/online-transducer-lstm'"):
        export(CenteredCtc(masked=True), str(tmp_path / "m.onnx"), inputs, outputs, contract="kaldi")
    assert os.listdir(tmp_path) == []
