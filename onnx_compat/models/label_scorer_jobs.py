"""Factories without arguments for ``onnx-compat label-scorer``: the bundled issue-46 scorers.

A factory on the command line is ``module:function`` called with no arguments
(``onnx_compat.factories``), so each bundled scorer the verb can write -- alone
or in ``--combine`` -- is one function here returning ``export_label_scorer``'s
keyword arguments:

- ``transformer_lm``: the Transformer LM as ``state-managed-onnx`` (``--manager transformer``);
- ``transformer_aed``: the Transformer AED (Conformer encoder, decoder with a KV cache) as ``state-managed-onnx``;
- ``transformer_aed_ctc``: that AED's CTC head as ``no-context-onnx`` (``ctc-prefix`` in a combination);
- ``lstm_lm``: the LSTM LM's ``[B, S]`` states (written for the transformer manager; ``--manager lstm``
  is refused: RASR master's lstm manager without encoder states meets undefined behaviour);
- ``transformer_lm_full_context``: the Transformer LM's whole-history step as ``full-context-onnx``, which
  needs ``--release full-context-pr`` (RASR's open PR #241);
- ``transducer``: the LSTM transducer (``stateful-transducer-onnx``, PR #149) and ``transducer_lm``: a
  Transformer LM over its vocabulary (its sentence end and start label ``label0``), the two scorers of
  a transducer + LM combination (RASR's time-synchronous search with ``num-label-scorers``).
"""
from __future__ import annotations

import torch

from . import lstm_lm as _lstm_lm
from . import transducer as _transducer
from . import transformer_decoder


def transformer_lm() -> dict:
    return transformer_decoder.label_scorer_job("lm")


def transformer_aed() -> dict:
    return transformer_decoder.label_scorer_job("aed")


def transformer_aed_ctc() -> dict:
    return transformer_decoder.label_scorer_job("ctc")


def lstm_lm() -> dict:
    model = _lstm_lm.tiny()
    job = transformer_decoder.label_scorer_job("lm")
    job.update(score=model.step, states=model.state_specs(), module=model)
    return job


def transformer_lm_full_context() -> dict:
    """No ``release``: the command line opts in with ``--release full-context-pr``."""
    model = transformer_decoder.tiny_lm()
    job = transformer_decoder.label_scorer_job("lm")
    for key in ("manager", "states"):
        job.pop(key)
    job.update(kind="full-context", score=model.full_context, module=model)
    return job

FAVOURED = (6, 7, 9)  # the labels the bundled transducer decodes most


def transducer() -> dict:
    return _transducer.label_scorer_job("transducer")


def transducer_lm() -> dict:
    """The transducer's lexicon is the LM's: its 12 labels, blank included (RASR never asks the LM about
    blank: the lm preset scores no transition into it)."""
    vocabulary = _transducer.label_scorer_job("transducer")["vocabulary"]
    model = transformer_decoder.tiny_lm(vocab=len(vocabulary), seed=1)
    with torch.no_grad():  # as if trained on the labels the tiny transducer emits (blank never seen)
        model.output.bias[list(FAVOURED)] += 3.0
        model.output.bias[len(vocabulary) - 1] -= 6.0
    return dict(kind="state-managed", manager="transformer", score=model.step, states=model.state_specs(),
                vocabulary=vocabulary, sentence_end=0, start_label=0, module=model)
