"""The native C++ consumer (``deploy/cpp/rasr_consumer``) as RASR's judge: ONNX Runtime's C++ API, RASR's I/O.

RASR feeds ``data`` float32 ``[B, T, F]`` and ``data:size1`` int32 and reads
``output`` and ``output:size1``, with one thread each. The program does the
same from raw little-endian files; here its outputs and lengths are compared
with the unpatched eager model at unequal lengths in one batch and at B=1.
Build it with ``make -C deploy/cpp`` (see ``docs/consumers.md``).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..runtimes.compare import closeness
from .consumers import ConsumerMismatch, eager, run_program

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BINARY = os.path.join(ROOT, "deploy", "cpp", "build", "rasr_consumer")


@dataclass(frozen=True)
class NativeRasrConsumer:
    binary: str = DEFAULT_BINARY
    cases: tuple = ((3, 41, (41, 23, 30)), (1, 19, (19,)))  # (B, T, lengths)
    atol: float = 1e-4
    rtol: float = 1e-3

    @property
    def name(self) -> str:
        return f"native C++ consumer ({os.path.basename(self.binary)}, ONNX Runtime C++ API)"

    def available(self) -> Optional[str]:
        return None if os.access(self.binary, os.X_OK) else f"{self.binary} is not built (make -C deploy/cpp)"

    def verify(self, folder, model_file, model, inputs, applied, vocabulary=None) -> dict:
        features = applied.io["inputs"][0]["dims"][2]
        worst, t0 = 0.0, time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="onnx_compat_native_", dir=folder) as work:
            for k, (batch, steps, lengths) in enumerate(self.cases):
                x = np.random.default_rng(k).standard_normal((batch, steps, features)).astype(np.float32)
                sizes = np.array(lengths, np.int32)
                x.tofile(os.path.join(work, "in.f32"))
                sizes.tofile(os.path.join(work, "in.i32"))
                shapes = json.loads(run_program([self.binary, model_file, os.path.join(work, "in.f32"), str(batch),
                                                 str(steps), str(features), os.path.join(work, "in.i32"),
                                                 os.path.join(work, "out")], self.name))
                want, want_len = (t.numpy() for t in eager(model, inputs, [torch.from_numpy(x), torch.from_numpy(sizes)])[:2])
                got = np.fromfile(os.path.join(work, "out.f32"), np.float32).reshape(shapes["output"])
                if shapes["lengths"] != want_len.tolist() or got.shape != want.shape:
                    raise ConsumerMismatch(self.name, k, f"lengths {want_len.tolist()} shape {list(want.shape)}",
                                           f"lengths {shapes['lengths']} shape {shapes['output']}", f" (B={batch}, T={steps})")
                valid = np.arange(want.shape[1])[None, :] < want_len[:, None]
                close = closeness(got, want, self.atol, self.rtol, valid, relative_to="largest")
                err = close.max_abs_err
                if not close.ok:
                    raise ConsumerMismatch(self.name, k, f"eager within {self.atol}", f"max abs err {err:.3g}",
                                           f" (B={batch}, T={steps}, lengths {list(lengths)})")
                worst = max(worst, err)
        return {"consumer": self.name, "ok": True, "cases": [c[:2] for c in self.cases], "max_abs_err": worst,
                "seconds": round(time.perf_counter() - t0, 3)}
