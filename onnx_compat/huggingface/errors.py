"""The refusals of ``from_pretrained_dir``: one class per kind of bad input, each raised before exporting.

Every error carries the folder, the task asked for and the model type read
from ``config.json`` (None where it was not known yet), so a caller can act on
them without parsing the message.
"""
from __future__ import annotations

from typing import Optional, Sequence

from onnx_compat.errors import OnnxCompatError


class HFError(OnnxCompatError, ValueError):
    """A transformers checkpoint folder that cannot be exported as asked."""

    def __init__(self, message: str, *, folder: str, task: Optional[str] = None, model_type: Optional[str] = None):
        super().__init__(message)
        self.folder, self.task, self.model_type = folder, task, model_type


class ConfigError(HFError):
    """No readable ``config.json`` with a ``model_type`` in the folder."""


class UncoveredModelError(HFError):
    """The model type is not one we wrap; ``covered`` lists those we do."""

    def __init__(self, message: str, *, covered: Sequence[str], **fields):
        super().__init__(message, **fields)
        self.covered = tuple(covered)


class TaskError(HFError):
    """The task is unknown, or not one this model type supports; ``supported`` lists those it does."""

    def __init__(self, message: str, *, supported: Sequence[str], **fields):
        super().__init__(message, **fields)
        self.supported = tuple(supported)


class PreprocessorError(HFError):
    """``preprocessor_config.json`` does not load, or disagrees with the model on a fixed size."""


class WeightsError(HFError):
    """The weights do not load, or the part to export has weights the checkpoint lacks (``missing``)."""

    def __init__(self, message: str, *, missing: Sequence[str] = (), **fields):
        super().__init__(message, **fields)
        self.missing = tuple(missing)


class FolderError(HFError):
    """The output folder holds another model's runtime files (``others``): writing ours beside them would mix
    two models' config, preprocessor and tokenizer files."""

    def __init__(self, message: str, *, others: Sequence[str] = (), **fields):
        super().__init__(message, **fields)
        self.others = tuple(others)
