"""Other runtimes to verify in as a deployment step: ``export(..., runtimes=[...])``.

Each runtime (another venv's ONNX Runtime, onnxruntime-node, OpenVINO) is
checked to be there before anything is exported; each attempt's verification
then runs in it as well (``Step.verify_in``), so under ``exporter="auto"`` a
graph that one of them cannot run falls back to the other exporter like any
graph that fails to verify.
"""
from __future__ import annotations

from typing import List, Sequence

from onnx_compat.pipeline.steps import Step
from onnx_compat.runtimes import as_runtimes


class RuntimesStep(Step):
    name = "runtimes"

    def __init__(self, runtimes: Sequence):
        self.given = list(runtimes)
        self.others: List[object] = []
        self.checks: dict = {}

    @property
    def verify_in(self) -> Sequence[object]:
        return self.others

    def before_capture(self, request) -> None:
        self.others = as_runtimes(self.given)  # a runtime that cannot run is refused now

    def before_write(self, request, report, proto) -> None:
        """The used graph's checks in each runtime, counted; OpenVINO's call latency kept in the timings."""
        for runtime in self.others:
            mine = [c for c in report.verification if c.get("runtime") == runtime.name]
            self.checks[runtime.name] = {"checks": len(mine), "ok": sum(1 for c in mine if c.get("ok"))}
            if getattr(runtime, "latencies", None):
                self.checks[runtime.name]["latency"] = runtime.latency()
                report.timings[f"{runtime.name} median call"] = runtime.latency()["median_s"]

    def describe(self) -> dict:
        return {"runtimes": self.checks,
                "summary": [f"runtime     {name}: {c['ok']}/{c['checks']} checks ok" for name, c in self.checks.items()]}
