"""Which failure to name first when every attempt of an exporter failed, with the patches and without.

A user acts on one error: the one that stops the model, not one the patches
made up on their way. The patched attempt's error comes first (the patches
usually get past the plain export's first stop, and the error then names what
stops the model next), unless

- the patched attempt failed in a patch's own code: an exception raised inside
  ``onnx_compat/patches/`` that is not one of its deliberate refusals (an
  ``OnnxCompatError`` naming the culprit), or an exporter failing on a node a
  patch wrote (a rewrite into an op the exporter lacks). The patches broke
  there; the plain export's error is the model's own;
- the plain attempt got further: it exported where the patched one did not,
  or passed the graph checks and failed only in verification.

Then the plain export's error comes first. Either way, the other is listed.
"""
from __future__ import annotations

import os
import re
import traceback
from typing import List, Optional, Sequence, Tuple

from onnx_compat.errors import CaptureError, ExportError, OnnxCompatError, VerificationError

_PATCHES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "patches") + os.sep
# how far an attempt got: captured nothing; a graph that failed its checks; cleaned; verified numbers
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_REACHED = {"capture": 0, "opset": 1, "dims": 1, "strict": 1, "cleanup": 2, "verify": 3}


def stage_of(exc: BaseException) -> str:
    """Where an attempt stopped: "capture", an ``ExportError``'s own stage, or "verify"."""
    if isinstance(exc, VerificationError):
        return "verify"
    if isinstance(exc, ExportError) and exc.stage:
        return exc.stage
    return "capture"


def _chain(exc: BaseException) -> List[BaseException]:
    found: List[BaseException] = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def _exporter_dirs() -> tuple:
    """The exporters' own code (torch, onnx, onnxscript, onnx_ir, wrapt): frames there are neither the
    model's nor a patch's."""
    import importlib.util
    found = []
    for name in ("torch", "onnx", "onnxscript", "onnx_ir", "wrapt", "onnxruntime"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(os.path.dirname(os.path.abspath(spec.origin)) + os.sep)
    return tuple(found)


def _innermost_own_frame(exc: BaseException):
    """The innermost frame of the traceback outside the exporters' code: the model's, or onnx_compat's."""
    skip = _exporter_dirs()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(skip)]
    return frames[-1] if frames else None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_OUTSIDE_WEIGHTS = "Cannot insert a Tensor that requires grad as a constant"


def outside_weights_hint(exc: BaseException) -> str:
    """The TorchScript tracer's "Cannot insert a Tensor that requires grad as a constant" means a module's
    weights reached the trace without being the exported model's parameters: a network kept outside the
    model (torchcrepe's in a module global, measured on the sweep). Said so, at the model's line that used
    them (the innermost frame outside the exporters and onnx_compat)."""
    chain = _chain(exc)
    if not any(_OUTSIDE_WEIGHTS in str(e) for e in chain):
        return ""
    skip = _exporter_dirs() + (_PACKAGE,)
    frames = [f for f in traceback.extract_tb(chain[-1].__traceback__)
              if not os.path.abspath(f.filename).startswith(skip)]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return (f" [weights that need grad reached the trace{at} without being the model's parameters or buffers: "
            f"a module kept outside the model (a module-level global, a plain list or dict); make it a submodule "
            f"of the model, or call requires_grad_(False) on it]")


def patch_site(exc: BaseException) -> Optional[str]:
    """``file:line`` in a patch's code where the failure arose, or None (also for a patch's deliberate
    refusal, which names the model's culprit, and for a wrapper that only called the original through)."""
    chain = _chain(exc)
    root = os.path.dirname(os.path.dirname(os.path.dirname(_PATCHES)))  # beside the package
    if any(isinstance(e, OnnxCompatError) and not isinstance(e, (CaptureError, ExportError)) for e in chain):
        return None  # a refusal onnx_compat raised on purpose (a SpectralError naming the op), or a verification
    innermost = _innermost_own_frame(chain[-1])
    if innermost is not None and os.path.abspath(innermost.filename).startswith(_PATCHES) and \
            "wrapped(" not in (innermost.line or ""):
        return f"{os.path.relpath(innermost.filename, root)}:{innermost.lineno}"
    node = getattr(next((e for e in chain if isinstance(e, CaptureError)), None), "node", None) or {}
    written = [m for m in _FRAME.finditer(str(node.get("stack_trace") or "")) if m.group(1).startswith(_PATCHES)]
    if written:  # the exporter failed on a node a patch's rewrite wrote
        return f"{os.path.relpath(written[-1].group(1), root)}:{written[-1].group(2)}"
    return None


def first(patched, plain) -> Tuple[object, Optional[str]]:
    """Of one exporter's patched and plain failed attempts (``report.Attempt``), the one to name first and,
    when it is the plain one, why."""
    if plain is None:
        return patched, None
    if patched.in_patches:
        return plain, (f"{patched.label} failed in a patch ({patched.in_patches}), so the plain export's error "
                       f"comes first")
    if _REACHED.get(plain.stage or "", 1) > _REACHED.get(patched.stage or "", 1):
        return plain, (f"{plain.label} got further ({plain.stage}) than {patched.label} ({patched.stage}), "
                       f"so its error comes first")
    return patched, None


def split(attempts: Sequence) -> Tuple[list, list]:
    """The failed attempts as each exporter's first cause, in the order the exporters were tried, and the
    others in the order they ran."""
    heads = []
    for exporter in dict.fromkeys(a.exporter for a in attempts):
        mine = [a for a in attempts if a.exporter == exporter]
        patched = next((a for a in mine if a.patched), mine[0])
        plain = next((a for a in mine if not a.patched), None)
        heads.append(first(patched, plain)[0])
    return heads, [a for a in attempts if all(a is not h for h in heads)]


def reasons(heads: Sequence, attempts: Sequence) -> List[str]:
    """Why a plain attempt's error is named first, for each exporter where it is."""
    said = []
    for head in heads:
        if head.patched:
            continue
        patched = next((a for a in attempts if a.exporter == head.exporter and a.patched), None)
        if patched is not None:
            said.append(first(patched, head)[1])
    return said
