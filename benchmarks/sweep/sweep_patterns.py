"""Names the root-cause pattern of each sweep error: the code form that stops an exporter.

Each pattern is a regex over the one-line error plus the library line it came
from (``sweep_run.library_frame``); the first match names it. A new error that no
regex knows stays "unclassified: <error>" so it shows up in the ranking.
"""
from __future__ import annotations

import linecache
import re
from typing import Dict, List, Tuple

# (name, regex over "error || where"); first match wins, so the specific ones come first
PATTERNS: Tuple[Tuple[str, str], ...] = (
    ("harness: *args forward (dynamic_shapes structure)", r"mismatch between the structure of `inputs` and `dynamic_shapes`"),
    ("timeout: dynamo export past the step limit", r"^timeout after"),
    # round two (sweep_models2.py)
    ("a torch.compile'd function inside the model (TorchScript cannot trace it)",
     r"torch\.jit\.trace a dynamo-optimized function"),
    ("int32 lengths reach ConstantOfShape: the graph does not load (TorchScript; export(auto) repairs it)",
     r"ConstantOfShape.*tensor\(int32\)"),
    ("sizes read from the values of a lengths tensor: lengths.tolist(), int(max(lengths)) (#39 pattern 1)",
     r"Max\(u\d+, u\d+|\|\|.*lengths(\.long\(\))?\.tolist\(\)|: lengths\.to|\|\|.*\.new\(lengths\)"),
    ("Tensor.unfold on a dynamic size (vanilla TorchScript; patched() covers)",
     r"operator Unfold, input size not accessible"),
    ("onnx_compat's unfold translation raises z_() (patched TorchScript)", r"z_\(\): incompatible function arguments"),
    ("torch.linalg.solve: aten._linalg_solve_ex has no ONNX function (dynamo)", r"_linalg_solve_ex"),
    ("round() of a constant buffer read with .item() (dynamo: no ONNX function for builtin round)",
     r"No ONNX function found for <built-in function round>"),
    ("a traced size that is a tensor reaches torch.is_tensor(n) then divmod (patched TorchScript; #39 pattern 5)",
     r"unsupported operand type\(s\) for divmod\(\): 'Tensor'"),
    ("squeeze_ of a dim that is not 1 (a no-op in torch) becomes an ONNX Squeeze that does not load (dynamo)",
     r"op_type:Squeeze.*must be 1 instead of"),
    ("repeat count from a difference of floor-divided sizes: sympy cannot solve the guard (dynamo)",
     r"The inequality, .* cannot be solved"),
    ("a ScriptModule: torch.export refuses it; onnx_compat's verify and export() fail on it without saying so",
     r"Exporting a ScriptModule is not supported|no signature found for <torch\.ScriptMethod|"
     r"contains\(\): incompatible function arguments|not part of the active trace|"
     r"is not an instance of torch\.nn\.Parameter"),
    ("a network kept in a module global, not a submodule (TorchScript: its weights as constants)",
     r"Cannot insert a Tensor that requires grad as a constant"),
    (".numpy() in forward (dynamo; #39 pattern 6 family)", r"\.numpy\(\) is not supported for tensor subclasses"),
    ("Python loop sized by a dynamic dim, e.g. for k in range(x.shape[1]) (dynamo: onnx_compat refuses the unrolled loop)",
     r"range\(\) takes the dynamic size"),
    ("reduction dims from torch.arange(...).tolist() (dynamo)", r"GuardOnDataDependentSymNode.*\|\|.*(dim=dims|\.tolist\(\))"),
    ("int() of a constant tensor made in forward (dynamo)", r"GuardOnDataDependentSymNode.*\|\|.*\bint\(\w+\["),
    ("F.fold with a dynamic output size (TorchScript)", r"translating col2im"),
    ("as_strided framing from x.stride() (dynamo)", r"aten\.sym_stride"),
    ("size arithmetic through torch.as_tensor / sympy Float (dynamo)",
     r"symbolically traced variables cannot be used as inputs to control flow"),
    ("ComplexPair into a torch.jit.script(_if_tracing) function (patched TorchScript)", r"found type 'ComplexPair'"),
    ("in-place update of an indexed slice in a scripted function (TorchScript)", r"cur_dim == dim INTERNAL ASSERT"),
    ("aten.clamp with a tensor min and a float max after decomposition (dynamo)",
     r"compatible OpOverload for aten\.clamp"),
    ("complex tensors / FFT (vanilla; patched() covers)",
     r"aten::(fft_\w+|view_as_complex|view_as_real|stft|istft|complex)'|Unknown number type: complex|"
     r"STFT does not currently support complex|complex-valued input"),

    ("assert on tensor values, e.g. assert (env > eps).all() (dynamo)",
     r"Could not guard on data-dependent expression.*\|\|.*\bassert\b"),
    ("onnx_compat stft/istft patch given n_fft/win_length as 0-d tensors (sizes traced as tensors, patched TorchScript)",
     r"SpectralError: torch\.(i?stft): invalid n_fft=tensor"),
    ("Python while loop over frame windows with int(tensor) (dynamo; TorchScript bakes the count)",
     r"GuardOnDataDependentSymNode.*\|\|.*int\(\w+\[-1\]\)|baked at [^|]*while \w+ < \w+"),
    ("onnx_ir pass fails after inlining (dynamo exporter bug)", r"PassError: An error occurred when running"),
    ("SDPA on tensors with ceil-div symbolic dims: onnxscript's translation fails (dynamo)",
     r"GraphConstructionError: .*aten_scaled_dot_product_attention"),
    ("the model's returned lengths exceed its output length (spec check)", r"lengths \[[^]]*\] do not fit dim"),
    ("Python loop over the batch: int(lengths[i] * T) per item (both)", r"Could not guard on data-dependent.*\|\|.*"
     r"lengths\[\w+\]|baked at [^|]*int\([^|]*lengths\[\w+\]"),
    ("Python if on a tensor buffer, e.g. a cache length (dynamo)", r"Could not guard on data-dependent expression"),
    ("conv weight made from the input's shape, e.g. filter.expand(C, -1, -1) (TorchScript)",
     r"convolution for kernel of unknown shape"),
    ("einops on a ComplexPair (patched TorchScript: stft output into rearrange)", r"Tensor type unknown to einops"),
    ("a size traced as a 0-d tensor, then used as a Python number (TorchScript)",
     r"Dimension specified as -?\d+ but tensor has no dimensions|has no attribute 'is_integer'"),
    ("len(tensor) as the batch size (TorchScript bakes B)", r"baked at [^|]*\blen\(\w+\)"),
    ("pack_padded_sequence into an RNN (vanilla dynamo; patched() covers)",
     r"zeros\(\): argument 'size' failed to unpack.*FakeTensor"),
    ("dynamo made a dynamic dim static (a guard on its size)", r"DimSpecialized|^\S+ axis \d+ \(\w+\) is \d+"),
    ("einx/einops shapes as Python ints: tuple(int(d) for d in x.shape) (TorchScript bakes; dynamo specialises)",
     r"baked at [^|]*int\(\w+\) for \w+ in \w+\.shape"),
    ("Python loop over time steps with the batch size kept on the module (speechbrain LiGRU)",
     r"baked at [^|]*self\.batch_size != x\.sha"),
    ("math.ceil / float arithmetic on a size baked (TorchScript)", r"baked at [^|]*(math\.ceil|ceil\()"),
    ("other size frozen while tracing, named by a TracerWarning (TorchScript)", r"baked at "),
    ("ONNX Runtime cannot broadcast two sizes at a new shape (a size baked; not isolated)",
     r"Attempting to broadcast an axis by a dimension other than 1"),
    ("a size frozen with no TracerWarning, e.g. x.data.shape (TorchScript: a Reshape fails at new sizes)",
     r"running Reshape node"),
    ("output of another shape than eager at a new size (silent: a size or loop count baked; not isolated)",
     r"has shape \[[^]]*\] in ONNX but"),
    ("wrong numbers at new sizes, cause not isolated", r"max abs err"),
)


# an attempt's own pattern this vague gives way to its patched twin's (which carries the library line)
VAGUE = ("unclassified: ", "dynamo made a dynamic dim static", "other size frozen while tracing",
         "wrong numbers at new sizes", "output of another shape", "Python if on a tensor buffer")


def pattern_of(error: str, where: str = "") -> str:
    text = f"{error} || {where}"
    for name, regex in PATTERNS:
        if re.search(regex, text, re.S):
            return name
    return "unclassified: " + error[:90]


_FROZEN_AT = re.compile(r"Python code at (\S+?):(\d+)")


def _frozen_line(error: str) -> str:
    """onnx_compat's hint on a TorchScript failure names where a size was frozen; its source line."""
    found = _FROZEN_AT.search(error)
    if not found:
        return ""
    path, line = found.group(1), int(found.group(2))
    return f"baked at {path.split('site-packages/')[-1]}:{line} {linecache.getline(path, line).strip()}"


def _failures(result: dict) -> List[Tuple[str, str, str]]:
    """(step, error, evidence) of every failed step; export(auto)'s attempts one by one."""
    out = []
    for step, o in result.get("steps", {}).items():
        evidence = " ".join([o.get("where", "")] + ["baked at " + b for b in o.get("baked_at", [])])
        if step == "auto":
            label = "auto" if o["stage"] != "ok" else "auto-fallback"
            for exporter, error in (o.get("attempts") or {}).items():
                out.append((f"{label}:{exporter}", error, _frozen_line(error)))
            if o["stage"] != "ok" and not o.get("attempts"):
                out.append(("auto", o.get("error", ""), evidence))
        elif o["stage"] != "ok":
            out.append((step, o.get("error", ""), evidence))
    return out


def classify(result: dict) -> dict:
    """Adds ``pattern_steps`` ({pattern: [steps]}) and ``patterns`` (for the table) to a sweep row.
    An export(auto) attempt gets the pattern of the patched step of its exporter when that failed too:
    the same trace (the plain steps carry the library line and every TracerWarning; the pipeline's
    error names one line)."""
    found: Dict[str, List[str]] = {}
    if "build" in result:
        found.setdefault("does not build: " + result["build"]["error"][:80], []).append("build")
    failures = _failures(result)
    named = {step: pattern_of(error, where) for step, error, where in failures}
    for step, error, where in failures:
        pattern = named[step]
        if step.startswith("auto") and ":" in step:
            # the pipeline's attempt is the patched export of the same exporter (then cleanup and checks)
            twin = "patched_ts" if step.endswith("torchscript") else "patched_dynamo"
            same = [named[s] for s, e, _ in failures if s == twin and _same_code(result, "auto", twin)]
            pattern = same[0] if same and pattern.startswith(VAGUE) else pattern
        found.setdefault(pattern, []).append(step)
    _blame_eager_check(result, found)
    result["pattern_steps"] = found
    result["patterns"] = [f"{p} ({', '.join(_short_steps(s))})" for p, s in found.items()]
    return result


def _same_code(result: dict, step: str, other: str) -> bool:
    """Both steps ran with the same onnx_compat (rows measured before ``code`` was recorded count as one run)."""
    steps = result.get("steps", {})
    return steps.get(step, {}).get("code") == steps.get(other, {}).get("code")


EAGER_CHECK = "state left by export()'s eager check, e.g. a Python cache of a length (both)"


def _blame_eager_check(result: dict, found: Dict[str, List[str]]) -> None:
    """export(auto) gives other numbers where the same exporter, patched, on a fresh model verified: the
    difference is the eager forward export() runs before tracing (rotary-embedding-torch fills its cache)."""
    steps = result.get("steps", {})
    auto = steps.get("auto", {})
    for exporter, plain in (("dynamo", "patched_dynamo"), ("torchscript", "patched_ts")):
        error = (auto.get("attempts") or {}).get(exporter, "")
        verified = steps.get(plain, {}).get("stage") == "ok" and _same_code(result, "auto", plain)
        if "max abs err" in error and verified:
            label = ("auto:" if auto["stage"] != "ok" else "auto-fallback:") + exporter
            for pattern, where in list(found.items()):
                if label in where:
                    where.remove(label)
                    if not where:
                        del found[pattern]
            found.setdefault(EAGER_CHECK, []).append(label)


_SHORT = {"vanilla_ts": "vTS", "vanilla_dynamo": "vDyn", "patched_ts": "pTS", "patched_dynamo": "pDyn",
          "auto:dynamo": "auto-Dyn", "auto:torchscript": "auto-TS", "auto-fallback:dynamo": "auto-Dyn→TS",
          "auto-fallback:torchscript": "auto-TS", "auto": "auto"}


def _short_steps(steps: List[str]) -> List[str]:
    return [_SHORT.get(s, s) for s in steps]
