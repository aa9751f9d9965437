"""Factories without arguments for ``onnx-compat export MODULE:FACTORY --contract sherpa-onnx/... --out FOLDER``.

A factory on the command line is ``module:function`` called with no arguments (``onnx_compat.factories``). For a
family writer's contract it returns that writer's keyword arguments (everything but the folder): the model(s),
the tokens, the lexicon, the front end's settings, ... The command line adds what its options say (``--exporter``,
``--no-verify``, ``--metadata``, ``--opset``, ``--atol``/``--rtol``, ``--language``, ``--vocabulary``) over them.
Each function here is the bundled tiny model of one family, as its tests build it:

- ``vits``: a piper-structured VITS voice (``export_vits``, ``sherpa-onnx/vits``);
- ``matcha`` / ``matcha_vocos``: a Matcha acoustic model with a HiFi-GAN / Vocos vocoder (``export_matcha``);
- ``nemo_rnnt`` / ``nemo_tdt``: a NeMo RNN-T / TDT (``export_nemo_transducer``, ``sherpa-onnx/nemo-transducer``);
- ``sense_voice``: a FunASR SenseVoiceSmall (``export_sense_voice``, ``sherpa-onnx/sense-voice``);
- ``paraformer``: a FunASR Paraformer (``export_paraformer``, ``sherpa-onnx/paraformer``).

Your own model's factory has the same form: ``def job(): return dict(model=..., tokens=..., ...)``.
"""
from __future__ import annotations

from . import funasr_models as _funasr
from . import nemo_transducer as _nemo

SAMPLE_RATE = 16000  # the tiny voices' rate (any rate the vocoder's hop makes sense of)
PUNCTUATION = ", . ! ?"


def vits() -> dict:
    """``export_vits``'s arguments for the tiny single-speaker piper voice."""
    from .vits import tiny_vits, tiny_voice
    tokens, lexicon = tiny_voice()
    return dict(model=tiny_vits(len(tokens), seed=1), tokens=tokens, lexicon=lexicon, sample_rate=SAMPLE_RATE,
                punctuation=PUNCTUATION)


def _matcha(kind: str) -> dict:
    from .matcha_tts import tiny_matcha, tiny_vocoder
    from .vits import tiny_voice
    tokens, lexicon = tiny_voice()
    return dict(acoustic=tiny_matcha(len(tokens), seed=3), vocoder=tiny_vocoder(kind, seed=3), vocoder_type=kind,
                tokens=tokens, lexicon=lexicon, sample_rate=SAMPLE_RATE)


def matcha() -> dict:
    """``export_matcha``'s arguments: the tiny Matcha with a HiFi-GAN vocoder."""
    return _matcha("hifigan")


def matcha_vocos() -> dict:
    """``export_matcha``'s arguments: the tiny Matcha with a Vocos vocoder (sherpa-onnx's inverse STFT)."""
    return _matcha("vocos")


def nemo_rnnt() -> dict:
    """``export_nemo_transducer``'s arguments: the tiny RNN-T (its vocabulary and durations from the model)."""
    return dict(model=_nemo.rnnt())


def nemo_tdt() -> dict:
    """``export_nemo_transducer``'s arguments: the tiny TDT (durations 0..4, 128 mel bins)."""
    return dict(model=_nemo.tdt())


def sense_voice() -> dict:
    """``export_sense_voice``'s arguments: the tiny SenseVoiceSmall, FunASR's front end (80 mels, LFR 7/6) and a
    CMVN given as ``(neg_mean, inv_stddev)`` (an ``am.mvn`` path works too)."""
    return dict(model=_funasr.sense_voice_small(), tokens=_funasr.sense_voice_tokens(),
                frontend_conf=_funasr.frontend_conf(), cmvn=_funasr.cmvn_stats(80 * 7))


def paraformer() -> dict:
    """``export_paraformer``'s arguments: the tiny Paraformer with its ``tokens.json`` list, as ``sense_voice``."""
    return dict(model=_funasr.paraformer(), tokens=_funasr.paraformer_tokens(),
                frontend_conf=_funasr.frontend_conf(), cmvn=_funasr.cmvn_stats(80 * 7))
