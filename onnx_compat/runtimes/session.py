"""The one way this package opens an ONNX Runtime session in its own process.

Verification, streaming, contracts, quantization, choosing, cleanup and
``onnx_compat.testing`` each need a session, and they differ only in a few
settings: how many threads (one for checks and timing, so runs on a shared
machine compare; ONNX Runtime's own default for the tests), how much ONNX
Runtime optimises (everything as a deployment does, only the portable basic
rewrites for the cleanup, nothing to learn which node has no kernel), whether
weights are repacked for fast kernels (not worth it for a session that runs
three checks), and whether the optimised graph is saved (the cleanup's
output). Those are the parameters of ``open_session``; nothing else in the
package builds ``SessionOptions`` or an ``InferenceSession``
(tests/test_runtime_layer.py reads the sources to hold that).

A model is a path (its external data files are read from beside it, as a
deployment reads them), a ``ModelProto`` or its serialized bytes (both must
hold their weights), or a session already open, which is returned as it is.
ONNX Runtime's own log is silenced by default: what fails is raised, and the
callers report it with the output, sizes or node it concerns.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import onnx
import onnxruntime as ort

ModelSource = Union[str, os.PathLike, onnx.ModelProto, bytes, ort.InferenceSession]

# ``optimization`` by name: "basic" writes standard ONNX ops only (the cleanup's portable rewrites), "all"
# adds ONNX Runtime's own fused ops and layouts (what a deployment runs), "none" loads the graph as it is.
OPTIMIZATION = {
    "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

# Initializers at least this large go to the saved graph's data file; smaller ones stay in the graph.
SAVED_WEIGHTS_MIN_BYTES = 1024


def open_session(model: ModelSource, threads: Optional[int] = 1, prepack: bool = True, *,
                 optimization: str = "all", provider: str = "CPUExecutionProvider",
                 save_optimized: Optional[Union[str, os.PathLike]] = None, saved_weights: Optional[str] = None,
                 disabled_optimizers: Sequence[str] = (), quiet: bool = True, spinning: bool = True,
                 external_data: Optional[Union[str, os.PathLike]] = None) -> ort.InferenceSession:
    """An ONNX Runtime session of ``model`` (path, ``ModelProto``, bytes; a session passes through).

    ``threads``: intra-op threads (one inter-op thread always); None leaves ONNX Runtime's default (every
    core). ``prepack=False``: weights are not repacked for faster kernels (a session for a few checks: the
    repacked copy of a 100 M-parameter model costs more time and memory than the runs it speeds up).
    ``optimization``: a key of ``OPTIMIZATION``. ``save_optimized``: where ONNX Runtime writes the graph it
    optimised; with ``saved_weights`` (a file name beside it) the initializers of at least
    ``SAVED_WEIGHTS_MIN_BYTES`` go there as raw bytes. ``disabled_optimizers``: ONNX Runtime's rewrites
    left out by name. ``quiet``: ONNX Runtime logs nothing (its errors are raised all the same).
    ``spinning=False``: idle pool threads sleep instead of spinning between runs (timing several sessions
    in turn: a spinning pool of one would steal the cores of the next one timed). ``external_data``: the
    folder the weight files of a proto or bytes loaded without them are in (a path finds its own).
    """
    if isinstance(model, ort.InferenceSession):
        return model
    _check_weights(model, external_data)
    opts = _options(threads, prepack, optimization=optimization, quiet=quiet, spinning=spinning)
    if external_data is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                      os.path.abspath(external_data))
    if save_optimized is not None:
        opts.optimized_model_filepath = os.fspath(save_optimized)
        if saved_weights is not None:
            opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", saved_weights)
            opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                          str(SAVED_WEIGHTS_MIN_BYTES))
    extra = {"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}
    return ort.InferenceSession(_loadable(model), opts, providers=[provider], **extra)


def _options(threads: Optional[int] = 1, prepack: bool = True, *, optimization: str = "all",
            quiet: bool = True, spinning: bool = True) -> ort.SessionOptions:
    """The ``SessionOptions`` of ``open_session``'s parameters."""
    if optimization not in OPTIMIZATION:
        raise ValueError(f"optimization must be one of {list(OPTIMIZATION)}, got {optimization!r}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = OPTIMIZATION[optimization]
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if quiet:
        opts.log_severity_level = 4  # failures are raised and reported by the caller, not logged twice
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def _check_weights(model, external_data) -> None:
    """A proto whose weights live in files, given without their folder, is refused here: ONNX Runtime would
    say only that a path "escapes" the model it was handed as bytes."""
    if isinstance(model, onnx.ModelProto) and external_data is None and \
            any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise ValueError("the ONNX model keeps its weights in external files: open it from its path, or pass "
                         "external_data=<the folder they are in>")


def _loadable(model) -> Union[str, bytes]:
    """What ``InferenceSession`` takes: a path as a string, a proto serialized, bytes as they are."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise TypeError(f"an ONNX model is a path, a ModelProto, bytes or an InferenceSession, got {type(model).__name__}")


def is_session(obj) -> bool:
    """Whether ``obj`` is an ONNX Runtime session already open (callers accept one in place of a model)."""
    return isinstance(obj, ort.InferenceSession)
