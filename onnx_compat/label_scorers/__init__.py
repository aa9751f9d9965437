"""Search-ready models for RASR's label scorers: the graphs, the config fragment, proven by decoding.

``export_label_scorer`` (``api.py``) writes the encoder and the decoder's
graphs (``stateful-onnx``, ``stateful-transducer-onnx``, ``fixed-context-onnx``,
``no-context-onnx``) as RASR calls them, emulates RASR's loader on them
(``loader.py``), and decodes through them as RASR does against the same
search over PyTorch (``backends.py``, ``search.py``, ``proof.py``); ``state-managed-onnx`` and
``full-context-onnx`` (``state_managed.py``, ``full_context.py``). ``combine_label_scorers``
(``combine.py``) writes several of them into one search, scaled, and proves the combined decode.
"""
from .api import LabelScorerReport, export_label_scorer
from .combine import CombinationReport, combine_label_scorers
from .errors import DecodeMismatch, LabelScorerError

__all__ = ["export_label_scorer", "combine_label_scorers", "LabelScorerReport", "CombinationReport",
           "LabelScorerError", "DecodeMismatch"]
