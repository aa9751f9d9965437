"""Every contract's name and the call that writes under it, in one table.

Four entry points write under a contract -- ``export`` (one graph), ``export_streaming`` (one streaming step),
``export_transducer`` (three graphs) and ``export_whisper`` (a Whisper checkpoint's two graphs; also
``export_pretrained(..., contract=...)``) -- and each knows only its own contracts. A name given to the wrong one, or
to none, is answered from this table: the call that writes that contract, or every contract there is. The table
names the contracts without importing them (each contract's module looks names up here when it refuses one);
``tests/test_contracts.py`` checks it against the contract objects.
"""
from __future__ import annotations

from typing import Dict

from ..errors import ArgumentError, OnnxCompatError
from .base import ContractError, Finding

#: name -> the call that writes a model under it
CALLS: Dict[str, str] = {
    "rasr": "export(..., contract='rasr')",
    "sherpa-onnx/nemo-ctc": "export(..., contract='sherpa-onnx/nemo-ctc', vocabulary=[...])",
    "sherpa-onnx/speaker-embedding": "export(..., contract='sherpa-onnx/speaker-embedding', metadata={...})",
    "sherpa-onnx/online-nemo-ctc": "export_streaming(..., contract='sherpa-onnx/online-nemo-ctc')",
    "sherpa-onnx/offline-transducer": "export_transducer(parts, folder, contract='sherpa-onnx/offline-transducer')",
    "sherpa-onnx/online-transducer-conformer": "export_transducer(parts, folder, states=..., "
                                               "contract='sherpa-onnx/online-transducer-conformer')",
    "sherpa-onnx/online-transducer-lstm": "export_transducer(parts, folder, states=..., "
                                          "contract='sherpa-onnx/online-transducer-lstm')",
    "sherpa-onnx/whisper": "export_whisper(checkpoint_folder, folder, language=...)",
    "sherpa-onnx/sense-voice": "export_sense_voice(model, folder, tokens=[...], frontend_conf={...}, cmvn='am.mvn')",
    "sherpa-onnx/paraformer": "export_paraformer(model, folder, tokens=[...], frontend_conf={...}, cmvn='am.mvn')",
    "sherpa-onnx/nemo-transducer": "export_nemo_transducer(nemo_model, folder)",
    "sherpa-onnx/vits": "export_vits(model, folder, tokens={...}, lexicon={...}, sample_rate=...)",
    "sherpa-onnx/matcha": "export_matcha(acoustic_model, vocoder, folder, vocoder_type='hifigan' | 'vocos', "
                          "tokens={...}, lexicon={...}, sample_rate=...)",
}

#: entry point -> what it writes, for the refusal of a contract it does not write
WRITES = {"export": "one graph", "export_streaming": "one streaming step",
          "export_transducer": "three graphs (encoder, decoder, joiner)",
          "export_whisper": "a transformers Whisper checkpoint's encoder and decoder",
          "export_sense_voice": "a FunASR SenseVoiceSmall's one graph",
          "export_paraformer": "a FunASR Paraformer's one graph",
          "export_nemo_transducer": "a NeMo RNN-T or TDT model's encoder, decoder and joiner",
          "export_vits": "a VITS voice's one graph, tokens.txt and lexicon.txt",
          "export_matcha": "a Matcha acoustic model and its vocoder, tokens.txt and lexicon.txt"}


def entry_point(name: str) -> str:
    """The function that writes under contract ``name`` (``export``, ``export_streaming``, ``export_transducer``)."""
    return CALLS[name].split("(", 1)[0]


def refused(name: object, here: str) -> OnnxCompatError:
    """The error for ``contract=name`` given to ``here``, which does not write it: a contract of another entry point
    is a ``ContractError`` naming that call; an unknown name an ``ArgumentError`` listing every contract with the
    call that writes it."""
    if isinstance(name, str) and name in CALLS:
        return ContractError(name, [Finding("entry point", CALLS[name], f"{here}(...), which writes {WRITES.get(here, 'other models')}")])
    entries = dict.fromkeys(entry_point(n) for n in CALLS)
    every = "; ".join(f"{entry}: {', '.join(repr(n) for n in CALLS if entry_point(n) == entry)}" for entry in entries)
    return ArgumentError(f"unknown contract {name!r}; every contract, by the call that writes it: {every}",
                         argument="contract", value=name)
