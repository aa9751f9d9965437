"""What an export did, as a Python object and as JSON."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional


def duration(seconds: float) -> str:
    """Seconds as a terminal line shows them: under 0.1 s in milliseconds, so that a call of OpenVINO or ONNX
    Runtime (a few hundred microseconds) does not read "0.00s"."""
    return f"{seconds * 1e3:.3g} ms" if 0 <= seconds < 0.1 else f"{seconds:.2f}s"


@dataclass
class Attempt:
    exporter: str
    ok: bool
    error: Optional[str] = None
    seconds: float = 0.0
    warnings: Dict[str, List[str]] = field(default_factory=dict)  # the used attempt's are Report.warnings too
    capture: List[str] = field(default_factory=list)  # dynamo: torch.onnx's capture strategies, in order
    culprit: Optional[str] = None  # "culprit <module path> (<Class>): <what>" of a failed attempt
    # what the attempt found on its way; the used attempt's become the report's own fields
    repairs: List[str] = field(default_factory=list)
    openvino: List[str] = field(default_factory=list)  # graph rewrites for OpenVINO (openvino_fixes.py)
    nodes_before_cleanup: Optional[int] = None
    timings: Dict[str, float] = field(default_factory=dict)
    # the way of capturing ("dynamo", "torchscript without the patches", ...): ``exporter`` names the exporter
    strategy: str = ""
    patched: bool = True  # False: the patches were set aside for this attempt
    acted: List[str] = field(default_factory=list)  # the patches whose wrapper ran during its capture
    stage: Optional[str] = None  # a failed attempt: where it stopped ("capture", "dims", "cleanup", "verify", ...,
    # "put off": auto's TorchScript trace depended on the example's sizes and dynamo went first)
    # a failed attempt whose error came from a patch's own code (not a refusal it raises): that file and line
    in_patches: Optional[str] = None
    assumed: List[str] = field(default_factory=list)  # draft export: what it took from the example to go on
    # dynamo: chunks of a dynamic dim whose count depends on its size (file:line and the rule), the likely cause of
    # a graph that holds that dim at the example's value
    counted: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.strategy or self.exporter


@dataclass
class Report:
    path: Optional[str] = None
    exporter: Optional[str] = None
    why: str = ""
    strategy: str = ""  # the attempt that made the graph ("dynamo without the patches": the patches were set aside)
    patched: bool = True
    # draft export: what it assumed to go on (the example's values where torch.export would have stopped); the
    # graph verified at other shapes all the same
    assumed: List[str] = field(default_factory=list)
    attempts: List[Attempt] = field(default_factory=list)
    opset: Dict[str, int] = field(default_factory=dict)
    ir_version: Optional[int] = None
    inputs: List[dict] = field(default_factory=list)
    outputs: List[dict] = field(default_factory=list)
    nodes: int = 0
    nodes_before_cleanup: Optional[int] = None
    ops: Dict[str, int] = field(default_factory=dict)
    auto_pad: List[str] = field(default_factory=list)
    findings: List[str] = field(default_factory=list)
    repairs: List[str] = field(default_factory=list)
    openvino: List[str] = field(default_factory=list)  # graph rewrites for OpenVINO (openvino_fixes.py)
    verification: List[dict] = field(default_factory=list)
    max_abs_err: Optional[float] = None
    degenerate: List[str] = field(default_factory=list)
    warnings: Dict[str, List[str]] = field(default_factory=lambda: {"baked": [], "other": []})
    metadata: Dict[str, str] = field(default_factory=dict)
    external_data: Optional[str] = None  # the weights' file beside the model (past protobuf's 2 GB)
    target: Optional[str] = None  # the ONNX Runtime release the model was made to load in
    timings: Dict[str, float] = field(default_factory=dict)
    # the proven float model's file as written ("sha256:<hex>"; with quantize, the float model beside it):
    # quantize() matches a report to the model it is given by this
    model_sha256: Optional[str] = None
    # what each deployment step did (``steps.py``), by step name, in the order they ran: "rasr", a contract's
    # name, "runtimes", "quantization", ...; an entry's "summary" holds its lines for the terminal
    steps: Dict[str, dict] = field(default_factory=dict)
    files: List[str] = field(default_factory=list)  # files written beside the model for its runtime
    speed: Optional[dict] = None  # auto timed both verified graphs: the one chosen, the others' time ratios
    # the export's own peak resident memory above the start, its ratio to the weights, and each stage's
    # (``memory.py``): {"bytes", "weights_bytes", "over_weights", "start_bytes", "method", "stages"}
    peak_memory: Optional[dict] = None

    @property
    def rasr(self) -> Optional[dict]:
        """The RASR step's entry ("ok", "findings", "roles", ...), or None without one."""
        return self.steps.get("rasr")

    @property
    def contract(self) -> Optional[dict]:
        """The entry of the (first) consumer contract step, RASR's included ("name", "consumer_checks", ...)."""
        return next((entry for entry in self.steps.values() if entry.get("kind") == "contract"), None)

    @property
    def quantization(self) -> Optional[dict]:
        """The quantization step's entry: the approximate model written, its measures and exclusions."""
        return self.steps.get("quantization")

    def to_dict(self) -> dict:
        """The fields, and the older callers' keys read from the steps ("rasr", "contract", "quantization")."""
        return {**asdict(self), "rasr": self.rasr, "contract": self.contract, "quantization": self.quantization}

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        return text

    def summary(self) -> str:
        """A few lines for a terminal."""
        def io(values):
            return ", ".join(f"{v['name']} {v['dtype']}{v['dims']}" for v in values)

        lines = [
            f"exporter    {self.strategy or self.exporter} ({self.why})",
            f"written     {self.path}" + (f" (weights in {self.external_data} beside it)" if self.external_data else ""),
            f"inputs      {io(self.inputs)}",
            f"outputs     {io(self.outputs)}",
            f"graph       {self.nodes} nodes"
            + (f" ({self.nodes_before_cleanup} before cleanup)" if self.nodes_before_cleanup else "")
            + f", opset {self.opset.get('ai.onnx')} (IR {self.ir_version}), auto_pad {len(self.auto_pad)}, "
            f"top ops {dict(list(self.ops.items())[:5])}",
        ]
        for check in self.verification:
            errs = ", ".join(f"{o['name']} {o['max_abs_err']:.2e}" + _against_float64(o) for o in check["outputs"])
            label = "example " if check.get("example") else "verified"
            where = f" in {check['runtime']}" if check.get("runtime") else ""
            lines.append(f"{label}    {check['sizes']}{where}: {'ok' if check['ok'] else 'FAILED'} (max abs err {errs})")
            if check.get("drift"):  # a stream against the whole-utterance forward
                lines.append(f"drift       {check['sizes']}: " + ", ".join(f"{k} {v:.2e}" for k, v in check["drift"].items())
                             + " (concatenated stream vs full forward)")
        for attempt in self.attempts:
            if not attempt.ok:
                lines.append(f"not used    {attempt.label} ({attempt.seconds:.1f}s): {attempt.error}")
                if attempt.culprit:
                    lines.append(f"            {attempt.culprit}")
            elif len(attempt.capture) > 1:  # torch.onnx retried another way; say which one made the graph
                lines.append(f"captured    {attempt.exporter}: " + "; then ".join(attempt.capture))
        lines += [f"assumed     {a}" for a in self.assumed]
        if self.target:
            lines.append(f"target      {self.target}")
        lines += [f"repaired    {r}" for r in self.repairs]
        lines += [f"finding     {f}" for f in self.findings]
        lines += self._baked_lines()
        if self.degenerate:
            lines.append(f"degenerate  {self.degenerate}")
        lines += [f"openvino    {line}" for line in self.openvino]
        lines += self._deployment_lines()
        lines.append("time        " + ", ".join(f"{k} {duration(v)}" for k, v in self.timings.items()))
        lines += self._memory_lines()
        return "\n".join(lines)

    def _memory_lines(self) -> List[str]:
        """The export's own peak above the memory in use when it started, against the weights' size, and the
        stage where it was reached."""
        memory = self.peak_memory
        if not memory:
            return []
        # below 16 MiB of weights the exporters' own working memory (tens of MiB) is what the peak measures:
        # a ratio to the weights would read hundreds of times and say nothing about them
        ratio = f" = {memory['over_weights']:.1f}x the weights ({memory['weights_bytes'] / 2**20:.0f} MiB)" \
            if memory.get("over_weights") is not None and memory.get("weights_bytes", 0) >= 16 * 2**20 else ""
        stages = memory.get("stages") or {}
        where = f", during {max(stages, key=stages.get)}" if stages else ""
        approx = "" if memory.get("method") == "VmHWM reset" else f" ({memory.get('method')})"
        return [f"memory      peak {memory['bytes'] / 2**20:.0f} MiB above the start{ratio}{where}{approx}"]

    def verified_elsewhere(self) -> int:
        """How many checks passed at sizes other than the export example (0 when any check failed)."""
        if not self.verification or not all(c["ok"] for c in self.verification):
            return 0
        return sum(1 for c in self.verification if not c.get("example"))

    def _baked_lines(self) -> List[str]:
        """TracerWarnings that turned a tensor into a Python number, grouped by source line. Verified at
        other shapes, they baked nothing that matters: one line says so instead of one line each."""
        baked = self.warnings.get("baked", [])
        if not baked:
            return []
        places = {}
        for w in baked:
            place = w.rsplit("(", 1)[-1].rstrip(")") if w.endswith(")") else w
            places[place] = places.get(place, 0) + 1
        listed = ", ".join(p + (f" x{k}" if k > 1 else "") for p, k in list(places.items())[:3])
        listed += f" and {len(places) - 3} more" if len(places) > 3 else ""
        checked = self.verified_elsewhere()
        if checked:
            return [f"tracer      {len(baked)} size-to-number warning(s) at {listed}: disproved, the graph verified "
                    f"at {checked} other shape(s)"]
        return [f"baked?      {w}" for w in baked]

    def _deployment_lines(self) -> List[str]:
        """The files beside the model; each step's own lines (its entry's "summary"), else its name."""
        lines = [f"beside      {', '.join(os.path.basename(f) for f in self.files)}"] if self.files else []
        for name, entry in self.steps.items():
            said = entry.get("summary")
            lines += [said] if isinstance(said, str) else list(said) if said else [f"step        {name}"]
        return lines


def _against_float64(output: dict) -> str:
    """How an output that passed against the float64 model did (``pipeline/float_noise.py``), or ""."""
    noise = output.get("float32_noise")
    if noise is None:
        return ""
    return (f" against float32 eager; {output['max_abs_err_float64']:.2e} against float64 eager, "
            f"whose own float32 error is {noise:.2e}")
