"""Where a complex call the pairs refuse sits in the model, and the complex linear algebra further on.

The spectral patches' refusal (``_complex.unsupported``) names the model's ``file:line`` and, when the model's
functions on the way to it call complex-capable linear algebra further on (nara-wpe stops first at
``x.ndimension()`` on its STFT, torch_wpe.py:92, and solves a complex system at torch_wpe.py:224), where: the
user learns of the real blocker at once. Kept apart from ``complex_linalg`` (which registers the refusals as
pair operations, so imports ``_complex``) so that ``_complex`` can read these without a circle.
"""
from __future__ import annotations

import dis
import functools
import os
from typing import List

from onnx_compat.patches._warning_site import frame_site, model_frame_outside_torch

# torch's names (``__torch_function__``'s func names) of complex-capable linear algebra; ``SOLVED`` have a pair form
# (``complex_linalg``: the real system of twice the order), the rest is refused
LINALG = ("linalg_solve", "linalg_solve_ex", "linalg_inv", "linalg_inv_ex", "inverse", "linalg_det", "det",
          "logdet", "slogdet", "linalg_slogdet", "linalg_eig", "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh",
          "linalg_cholesky", "cholesky", "cholesky_solve", "cholesky_inverse", "linalg_lstsq", "linalg_pinv",
          "pinverse", "linalg_svd", "svd", "linalg_svdvals", "linalg_qr", "qr", "linalg_lu", "linalg_lu_factor",
          "linalg_lu_solve", "linalg_solve_triangular", "triangular_solve", "linalg_matrix_exp", "matrix_exp")
SOLVED = ("linalg_solve", "linalg_inv", "inverse")
# the attribute names a model's bytecode loads for the refused ones (``torch.linalg.det``, ``x.pinverse()``)
_CALLED = {name.split("linalg_", 1)[-1] for name in LINALG if name not in SOLVED}
EXPORTABLE = ("a complex torch.linalg.solve or inverse of a static order up to 32 exports (as the real system of "
              "twice the order, [[Re A, -Im A], [Im A, Re A]] [Re x; Im x] = [Re b; Im b]): write the step with "
              "those, or run it outside the exported graph")


def model_site() -> str:
    """"<file>:<line>: " of the model's call being refused, or "" when no model frame is on the stack."""
    frame = model_frame_outside_torch(2)
    return "" if frame is None or _machinery(frame.f_code.co_filename) else f"{frame_site(frame)}: "


def further_on() -> str:
    """" Further on, <file>:<line> calls <name> ..." for the model functions on the current stack (innermost
    first) whose code calls complex-capable linear algebra; "" when none does."""
    sites = _linalg_sites()
    if not sites:
        return ""
    return (f". Further on, {', '.join(sites[:3])} calls linear algebra on what are complex values here: "
            f"complex linear algebra is missing too ({EXPORTABLE})")


def _linalg_sites() -> List[str]:
    frame, sites = model_frame_outside_torch(2), []
    while frame is not None and _PIPELINE not in os.path.abspath(frame.f_code.co_filename):  # the model's calls
        if not _machinery(frame.f_code.co_filename):
            sites += [f"{frame.f_code.co_filename}:{line} ({name})" for line, name in _calls(frame.f_code)]
        frame = frame.f_back
    return list(dict.fromkeys(sites))


_PIPELINE = os.sep + os.path.join("onnx_compat", "pipeline") + os.sep


def _machinery(filename: str) -> bool:
    """torch's, onnx_compat's own or Python's files: not the model's."""
    path = os.path.abspath(filename)
    return any(part in path for part in (os.sep + "torch" + os.sep, os.sep + "onnx_compat" + os.sep,
                                         os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep))


@functools.lru_cache(maxsize=256)
def _calls(code) -> tuple:
    """(line, "torch.linalg.<name>") for each load of a linear-algebra name in ``code``."""
    found, line, linalg = [], None, False
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if getattr(ins, "positions", None) and ins.positions.lineno else line
        if ins.opname.startswith("LOAD_") and ins.argval == "linalg":
            linalg = True
            continue
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in _CALLED and (linalg or
                                                                                     ins.argval == "pinverse"):
            found.append((line, f"torch.linalg.{ins.argval}" if linalg else f".{ins.argval}()"))
        linalg = False
    return tuple(found)
