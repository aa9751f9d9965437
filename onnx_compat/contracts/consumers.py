"""Running a written model inside its consumer, and the eager reference it must agree with.

sherpa-onnx ends the process when a model breaks its rules, so its Python
binding runs in a child interpreter (this one's), and the native binary as a
program; both read the model and ``tokens.txt`` from the folder they were
written to, as a deployment does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..spec import forward_arguments
from ..errors import OnnxCompatError
from ..model_state import preserved


class ConsumerMismatch(OnnxCompatError, RuntimeError):
    """The consumer's result differs from eager PyTorch's on the same input, or the consumer failed on it.
    ``case``: the utterance or input case (None: the consumer's run as a whole), ``expected``, ``got``.
    ``cause``: what a second run found, when it found one: "padding" (each utterance decoded alone matches
    PyTorch, so the model's output depends on the padding of the consumer's batch) or "batch" (the same for a batch
    of streams, which sherpa-onnx stacks without padding); ``alone``: the consumer's result of each utterance
    decoded alone (None when nothing was run again)."""

    def __init__(self, consumer: str, case: Optional[int], expected, got, detail: str = "", *,
                 cause: Optional[str] = None, alone: Optional[list] = None):
        self.consumer, self.case, self.expected, self.got = consumer, case, expected, got
        self.cause, self.alone = cause, alone
        where = "" if case is None else f" case {case}"
        super().__init__(f"{consumer}:{where}{detail}: expected {expected}, got {got}"
                         + (f"; {cause}: {CAUSES[cause]}" if cause else ""))


#: What each ``ConsumerMismatch.cause`` means for the model, and what to change.
CAUSES = {
    "padding": "the model's output depends on the padding of the batch: each utterance alone matches PyTorch "
               "(the consumer pads a batch to its longest utterance; the model must leave the padded frames out "
               "by its lengths input: a mask, no mean, norm or attention over the whole padded time axis)",
    "batch": "the model's output for one stream depends on the other streams of the batch: each utterance alone "
             "matches PyTorch (the consumer stacks the ready streams on the batch axis; nothing may mix across it)",
}


def eager(model: torch.nn.Module, inputs, tensors: Sequence[torch.Tensor]):
    """``model``'s outputs on ``tensors`` (ONNX input order), called as the export calls it, as a tuple: in eval
    mode whatever mode the model is in (inside the pipeline, after a TorchScript capture, it was in training
    mode: dropout made the reference differ), and left as it was."""
    pairs = forward_arguments(model, inputs)
    with preserved(model), torch.no_grad():
        if all(arg is None for _, arg in pairs):
            out = model(*tensors)
        else:
            out = model(**{arg: t for (_, arg), t in zip(pairs, tensors)})
    return out if isinstance(out, (tuple, list)) else (out,)


def greedy_ctc(log_probs: np.ndarray, frames: int, blank: int) -> List[int]:
    """Best class per frame over the first ``frames``, repeats merged, blanks dropped."""
    best, out, prev = log_probs[:frames].argmax(-1), [], -1
    for k in best.tolist():
        if k != blank and k != prev:
            out.append(k)
        prev = k
    return out


def run_child(code: str, args: Sequence[str], what: str, timeout: int = 300) -> str:
    """Stdout of ``code`` run by this interpreter; a failure quotes the consumer's last log line."""
    return run_program([sys.executable, "-c", code, *args], what, timeout)


def run_program(command: Sequence[str], what: str, timeout: int = 300, stderr: bool = False) -> str:
    """Stdout of ``command`` (``stderr``: its stderr, where sherpa-onnx's streaming binary prints results); a
    failure (sherpa-onnx exits on a model it refuses) is a ``ConsumerMismatch``
    quoting the consumer's last log line. Undecodable bytes are replaced: sherpa-onnx logs the raw byte it
    refuses (``base64-decode.cc``: ``Unknown character %c``), which is no UTF-8."""
    done = subprocess.run(list(command), capture_output=True, text=True, errors="replace", timeout=timeout)
    if done.returncode != 0:
        raise ConsumerMismatch(what, None, "a result", f"exit code {done.returncode}: {_last_line(done.stderr)}")
    return done.stderr if stderr else done.stdout


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def installed(module: str) -> Optional[str]:
    """Why ``module`` cannot be imported here, or None."""
    import importlib.util
    return None if importlib.util.find_spec(module) else f"{module} is not installed (pip install {module.replace('_', '-')})"


def program(name: str) -> Optional[str]:
    """The path of a console program: on PATH, or beside this interpreter (a venv's bin)."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return shutil.which(name) or (beside if os.access(beside, os.X_OK) else None)


def metadata_of(folder_model: str) -> Dict[str, str]:
    import onnx
    proto = onnx.load(folder_model, load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props}


def as_json(text: str):
    return json.loads(text.strip().splitlines()[-1])
