"""Functions and modules wrapped by ``torch.compile`` inside a model being exported.

Libraries compile their helpers (``torch.compile(fn)``, ``@torch.compile``, a
lazy ``torch_compile_lazy`` that compiles on first call, a submodule replaced
by ``torch.compile(module)``, an ``OptimizedModule``). Every such call goes
through dynamo's ``compile_wrapper`` (``torch._dynamo.eval_frame``), which,
measured on torch 2.13:

* under the TorchScript exporter raises "Detected that you are using FX to
  torch.jit.trace a dynamo-optimized function. This is not supported at the
  moment." (audioseal's SEANet: the whole model refused);
* under the dynamo exporter's non-strict capture (no ``TracingContext``)
  compiles the function again with dynamo in the middle of the export's
  tracing, instead of letting the tracer follow its Python.

While exporting, each call runs the original function instead, as dynamo's
wrapper does by itself inside a kernel invocation: its first check is
``TracingContext.try_get()`` with a fake mode ``in_kernel_invocation``, then
``return fn(*args, **kwargs)``. So the patch answers that one call, and only
when the caller is dynamo's ``compile_wrapper`` with no context of its own,
with a context that says so. No other caller of ``try_get`` sees a change (the
gate checks the calling frame before the patch acts), and nothing is compiled.
The Python the exporters then follow is the function's own: the numbers are
the uncompiled model's, which is what verification compares with
(``uncompiled()``).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional

from onnx_compat.patches import when
from onnx_compat.patches.registry import Patch, register


def _compile_wrapper_code():
    """The code of dynamo's ``compile_wrapper`` (every compiled function's and ``OptimizedModule``'s
    forward), or None where this torch has none."""
    try:
        from torch._dynamo import eval_frame
    except Exception:  # noqa: BLE001 - torch 2.0 without dynamo on this platform, or a broken install
        return None
    call = getattr(getattr(eval_frame, "_TorchDynamoContext", None), "__call__", None)
    consts = getattr(getattr(call, "__code__", None), "co_consts", ())
    return next((c for c in consts if getattr(c, "co_name", None) == "compile_wrapper"), None)


_WRAPPER = None  # found on first use: importing torch._dynamo costs time an export pays anyway


def _wrapper_code():
    global _WRAPPER
    if _WRAPPER is None:
        _WRAPPER = _compile_wrapper_code() or False
    return _WRAPPER or None


def _called_by_compiled_function() -> bool:
    """An export is running and the ``try_get`` being asked comes from dynamo's ``compile_wrapper`` (the
    frames of the patch machinery in between are skipped)."""
    if not when.any_exporting():
        return False
    code = _wrapper_code()
    frame = sys._getframe(1)
    for _ in range(6):  # the gate, wrapt's Python fallback, then the caller
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        name = frame.f_code.co_filename
        if not ("onnx_compat" in name and "patches" in name) and "wrapt" not in name:
            return False
        frame = frame.f_back
    return False


# the moment this patch acts: a call from a compiled function's wrapper while exporting
when.WHEN.setdefault("compiled_call", _called_by_compiled_function)


class _KernelInvocation:
    """What dynamo's wrapper reads of a context to call the original function: a fake mode inside a kernel."""

    class fake_mode:  # noqa: N801 - the attribute dynamo reads
        in_kernel_invocation = True


def _try_get(wrapped, instance, args, kwargs):
    found = wrapped(*args, **kwargs)
    return found if found is not None else _KernelInvocation


@contextlib.contextmanager
def uncompiled() -> Iterator[None]:
    """Compiled functions run as the plain Python they wrap (``torch.compiler.set_stance("force_eager")``):
    the eager reference verification compares with is the uncompiled model's, and it is not compiled
    with inductor on every new size (150 s on a small SEANet). A no-op where torch has no stance, or
    inside a compiled region (where set_stance is refused)."""
    stance = _force_eager()
    if stance is None:
        yield
        return
    with stance:
        yield


def _force_eager() -> Optional[contextlib.AbstractContextManager]:
    compiler = sys.modules.get("torch.compiler")
    set_stance = getattr(compiler, "set_stance", None)
    dynamo = sys.modules.get("torch._dynamo")
    if set_stance is None or dynamo is None:  # nothing can have been compiled without dynamo loaded
        return None
    try:
        return set_stance("force_eager")
    except Exception:  # noqa: BLE001 - refused inside a compiled region: leave it as it is
        return None


register(Patch(
    name="compiled_as_python",
    description="functions and modules wrapped by torch.compile run their original Python while exporting "
                "(TorchScript refused them: 'Detected that you are using FX to torch.jit.trace a "
                "dynamo-optimized function'; dynamo recompiled them inside its own capture)",
    targets=("torch._guards:TracingContext.try_get",),
    wrapper=_try_get,
    when="compiled_call",
    aliases=False,
    min_torch="2.1",
))
