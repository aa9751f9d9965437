"""transformers checkpoint folders to proven ONNX models with lengths, no user code.

``from_pretrained_dir(folder, task)`` returns an ``HFJob`` (the wrapper
module, its ``TensorSpec``s, the fixed sizes, the runtime files);
``export_pretrained(folder, path, task, **export_kwargs)`` exports it through
``onnx_compat.export`` and writes the config, preprocessor and tokenizer files
beside the model. ``families.py`` says which model types and tasks are covered.
"""
from .errors import (ConfigError, FolderError, HFError, PreprocessorError, TaskError, UncoveredModelError,  # noqa: F401
                     WeightsError)
from .families import COVERED, TASK_NAMES  # noqa: F401
from .job import HFJob, export_pretrained, from_pretrained_dir  # noqa: F401

__all__ = ["from_pretrained_dir", "export_pretrained", "HFJob", "HFError", "ConfigError", "UncoveredModelError",
           "TaskError", "PreprocessorError", "WeightsError", "FolderError", "COVERED", "TASK_NAMES"]
