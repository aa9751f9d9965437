"""OpenVINO as a verification runtime: ``verify(..., runtimes=[openvino_runtime()])``.

OpenVINO is where many of our users deploy on Intel CPUs, and it runs ONNX
graphs through its own converter and kernels, so a model right in ONNX
Runtime can be wrong there (``openvino_fixes.py`` lists what we found). The
runtime is forced to f32: on this machine OpenVINO's CPU default is bf16
(errors ~1e-2), which would hide real differences behind rounding -- a
deployment that wants bf16 chooses it knowingly. Inputs go in the way users
call it, ``compiled_model(feeds)`` (OpenVINO shares the input memory), with
one compiled model per file kept across calls, so state leaking from one call
into the next shows up. Each call's latency is kept (``latencies``).
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from onnx_compat.errors import RuntimeUnavailable
from onnx_compat.runtimes import Runtime


@dataclass
class OpenVinoRuntime(Runtime):
    """OpenVINO's ``device`` at ``precision`` (the INFERENCE_PRECISION_HINT), in this process."""

    device: str = "CPU"
    precision: str = "f32"
    threads: int = 1
    latencies: List[float] = field(default_factory=list)  # seconds per inference call, in call order
    _compiled: Dict[tuple, object] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return f"OpenVINO {self.version} ({self.device}, {self.precision})"

    def _compile(self, model_path: str):
        import openvino as ov
        key = (os.path.abspath(model_path), os.stat(model_path).st_mtime_ns)
        if key not in self._compiled:
            config = {"INFERENCE_PRECISION_HINT": self.precision}
            if self.threads:
                config["INFERENCE_NUM_THREADS"] = self.threads
            self._compiled[key] = ov.Core().compile_model(os.fspath(model_path), self.device, config)
        return self._compiled[key]

    def run(self, model_path: str, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Outputs by name, as OpenVINO computes them (arrays copied: OpenVINO may reuse its buffers)."""
        compiled = self._compile(model_path)
        wanted = {name for port in compiled.inputs for name in port.get_names()}
        t0 = time.perf_counter()
        result = compiled({k: np.ascontiguousarray(v) for k, v in feeds.items() if k in wanted})
        self.latencies.append(time.perf_counter() - t0)
        out = {}
        for port, value in result.items():
            for name in port.get_names():
                out[name] = np.array(value, copy=True)
        return out

    def latency(self) -> dict:
        """Median and worst seconds per call so far (the report's figure)."""
        if not self.latencies:
            return {"calls": 0}
        return {"calls": len(self.latencies), "median_s": statistics.median(self.latencies), "max_s": max(self.latencies)}


def openvino_runtime(device: str = "CPU", precision: str = "f32", threads: int = 1) -> OpenVinoRuntime:
    """OpenVINO checked now: installed, and ``device`` present (one clear error before anything is exported)."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise RuntimeUnavailable(f"OpenVINO is not installed (pip install openvino): {exc}") from exc
    devices = ov.Core().available_devices
    if device not in devices:
        raise RuntimeUnavailable(f"OpenVINO has no device {device!r} here (it has {devices})")
    version = ov.get_version().split("-")[0]
    return OpenVinoRuntime("openvino", ("openvino",), version, {}, device=device, precision=precision, threads=threads)
