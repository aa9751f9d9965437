"""The export pipeline for sequence models.

spec -> example inputs -> output check -> export under patches (dynamo, then
TorchScript when ``auto``) -> dynamic dims check -> verification against the
unpatched eager model -> metadata -> RASR check -> atomic write -> report.
Everything that can be checked before the export is checked first, and
nothing is written unless every step passed.
"""
from __future__ import annotations

import functools
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Mapping, Optional, Sequence, Union

import onnx
import torch

from . import __version__, exporters, flags, graph, targets
from .io_adapter import IOAdapter, SpecError, check_outputs, flatten
from .culprit import culprit
from .rasr import check_rasr
from .runtimes import as_runtimes
from .repair import repair_int_types
from .report import Attempt, Report
from .safety import check_room, check_writable, preserved, write_atomically
from .spec import TensorSpec, check_examples, example_inputs, forward_arguments
from .verify import VerificationError, reference_cases, verify as verify_model
from . import weights
from .weights import folder_for, weight_bytes


class ExportError(RuntimeError):
    """No exporter produced a model that passed every check."""


def _as_specs(specs, what: str) -> List[TensorSpec]:
    specs = [specs] if isinstance(specs, TensorSpec) else list(specs or ())
    if not specs or not all(isinstance(s, TensorSpec) for s in specs):
        raise TypeError(f"{what} must be a TensorSpec or a non-empty list of TensorSpec")
    return specs


def export(model: torch.nn.Module, path: str, inputs, outputs, *, exporter: str = "auto",
           sizes: Optional[Mapping[str, int]] = None, verify: bool = True, atol: float = 1e-4, rtol: float = 1e-3,
           strict: bool = False, rasr: Union[bool, dict] = False, metadata: Optional[Mapping[str, str]] = None,
           opset: Optional[int] = None, seed: int = 0, patches: Optional[dict] = None,
           cleanup: Optional[bool] = None, examples=None, target: Optional[str] = None, runtimes=(),
           external_data: Optional[bool] = None) -> Report:
    """Export ``model`` to ``path`` and prove it; return the ``Report``.

    ``inputs``/``outputs``: ``TensorSpec`` lists in ONNX order. ``exporter``:
    "dynamo", "torchscript" or "auto" (dynamo first, TorchScript when dynamo
    fails to export or to verify). ``sizes`` overrides the example size of
    named dims. ``strict``: baked-constant TracerWarnings and degenerate
    outputs are errors. ``rasr``: True (or ``check_rasr`` keyword arguments)
    requires RASR's rules to hold. ``patches``: options for ``patched()``.
    ``cleanup``: run ONNX Runtime's basic offline optimiser (``cleanup.py``), then verify (default:
    TorchScript exports, and dynamo exports holding LSTM/GRU nodes; dynamo
    optimizes the rest of its graphs itself). ``examples``: real inputs
    ``[{onnx_name: tensor}, ...]``; the first is the export example unless
    ``sizes`` is given, and every one is verified besides the generated shapes.
    ``target``: the ONNX Runtime release the model must load in
    (``"onnxruntime==1.16"``): the newest opset it implements that the
    exporter writes, and its IR version (see ``targets.py``). ``runtimes``:
    other ONNX Runtimes to verify in as well (``verify``'s argument). ``external_data``: the weights
    in ``<path>.data`` beside the graph (default: from 1 GiB of weights on; past 2 GB it is a must). It
    also lowers the peak memory of the export (measured in ``benchmarks/model_size.py``).
    """
    t_start = time.perf_counter()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if exporter not in exporters.EXPORTERS + ("auto",):
        raise ValueError(f"unknown exporter {exporter!r}; choose from {exporters.EXPORTERS + ('auto',)}")
    inputs, outputs = _as_specs(inputs, "inputs"), _as_specs(outputs, "outputs")
    names = [n for s in inputs + outputs for n in s.onnx_names]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecError(f"ONNX names must be unique; {dupes} appear more than once")
    deploy = targets.parse_target(target) if target is not None else None
    if deploy is not None and opset is not None and opset > deploy.opset:
        raise targets.TargetError(f"opset={opset} is newer than {deploy} implements")
    others = as_runtimes(runtimes)
    written = check_writable(path)
    pairs = forward_arguments(model, inputs)
    checked = check_examples(inputs, examples)
    example, args = example_inputs(inputs, checked, sizes, seed)
    if exporter == "auto":
        order = list(exporters.EXPORTERS) if exporters.HAS_DYNAMO else ["torchscript"]
    else:
        order = [exporter]

    size = weight_bytes(model)
    if external_data is False and size >= weights.PROTOBUF_LIMIT:
        raise ValueError(f"external_data=False: the weights ({size / 2**30:.2f} GiB) do not fit in one protobuf "
                         "(2 GB); leave external_data at None or True")
    check_room(written, size)
    report = Report(path=written, target=str(deploy) if deploy else None)
    # weights from 1 GiB on stay in a data file beside the graph (weights.py), removed unless written
    spilled = external_data if external_data is not None else size >= weights.IN_MEMORY_LIMIT
    with folder_for(written, spilled) as spill:
        with preserved(model):
            adapter = IOAdapter(model, pairs, outputs)
            with torch.no_grad():
                returned = flatten(adapter(*args))
            outputs = check_outputs(returned, outputs, example)
            proto, results = None, None
            for name in order:
                t0 = time.perf_counter()
                try:
                    asked = targets.opset_for(name, opset, deploy)
                    # cleanup follows a TorchScript export by default and folds constants in C++: the exporter's
                    # own folding pass would only do it first, more slowly (12 x 256 Conformer: 0.2 s)
                    fold = name != "torchscript" or cleanup is False
                    proto, captured = exporters.run(name, adapter, args, inputs, outputs, asked, patches,
                                                    fold=fold, weights=spill)
                    _check_opset(proto, asked, name)
                    proto, report.repairs = repair_int_types(proto)
                    report.repairs += [c for c in [targets.fit(proto, deploy)] if c]
                    report.warnings = {"baked": captured.baked, "other": captured.other}
                    if strict and captured.baked:
                        raise ExportError(f"strict: a tensor was turned into a Python number while tracing: {captured.baked[0]}")
                    _check_dims(proto, inputs + outputs, "")
                    t1 = time.perf_counter()
                    report.timings[f"export_{name}"] = t1 - t0
                    check = functools.partial(_fit_and_verify, deploy=deploy, model=model, inputs=inputs,
                                              outputs=outputs, atol=atol, rtol=rtol, runtimes=others, weights=spill,
                                              example=example, seed=seed + 1, examples=checked)
                    cases = functools.partial(reference_cases, model, inputs, outputs, example=example, seed=seed + 1,
                                              examples=checked)
                    # the exporter's own bytes go to ONNX Runtime unless repair or fit changed the graph
                    serialized = None if report.repairs else captured.serialized
                    if _wants_cleanup(cleanup, name, proto):
                        proto, results = _cleaned(proto, report, inputs + outputs, check if verify else None,
                                                  cases, spill, serialized)
                    elif verify:
                        results = check(proto, serialized=serialized)  # eager runs while ONNX Runtime loads
                        report.timings["verify"] = time.perf_counter() - t1
                    report.attempts.append(Attempt(name, True, None, time.perf_counter() - t0, capture=captured.capture))
                    break
                except Exception as exc:
                    proto = None
                    seen = getattr(exc, "onnx_compat_warnings", None)
                    warned = {"baked": seen.baked, "other": seen.other} if seen else report.warnings
                    what = exporters.error_line(exc)
                    error = what + _baked_hint(warned["baked"])
                    pointed = culprit(exc, model, what) or _diagnosed(exc, model, inputs, outputs, name, checked, sizes,
                                                                      atol, rtol, seed, patches)
                    report.attempts.append(Attempt(name, False, error, time.perf_counter() - t0, warned,
                                                   capture=seen.capture if seen else [], culprit=pointed))
                    # what this attempt left on the report belongs to it, not to the next one
                    report.warnings, report.repairs, report.nodes_before_cleanup = {"baked": [], "other": []}, [], None
                    if exporter != "auto":
                        raise ExportError(f"{name} export failed: {error}" + (f"\n{pointed}" if pointed else "")) from exc
            if proto is None:
                raise ExportError("no exporter produced a verified model" + _only_torchscript() + ": " +
                                  "; ".join(f"{a.exporter}: {a.error}" for a in report.attempts) +
                                  "".join(f"\n{a.culprit} ({a.exporter})" for a in report.attempts if a.culprit))
        report.exporter = name
        report.why = ("requested" if exporter != "auto" else
                      "dynamo exported and verified" if name == "dynamo" else
                      "fallback: dynamo did not export or verify" if exporters.HAS_DYNAMO else
                      "the only exporter" + _only_torchscript())
        if results is not None:
            report.verification = [r.to_dict() for r in results]
            report.max_abs_err = max((o.max_abs_err for r in results for o in r.outputs), default=0.0)
            report.degenerate = sorted({o.name for r in results for o in r.outputs if o.degenerate})
            if strict and report.degenerate:
                raise ExportError(f"strict: outputs {report.degenerate} are constant at the verified shapes; "
                                  "the comparison proves nothing")

        graph.set_metadata(proto, _metadata(inputs, outputs, name, metadata))
        if rasr:
            rasr_args = rasr if isinstance(rasr, dict) else _rasr_names(inputs, outputs)
            check = check_rasr(proto, **rasr_args)
            report.rasr = check.to_dict()
            if not check.ok:
                raise ExportError("RASR would refuse this model: " + "; ".join(check.findings))
        summary = graph.inspect(proto)
        for key in ("opset", "ir_version", "inputs", "outputs", "nodes", "ops", "auto_pad", "metadata", "findings"):
            setattr(report, key, summary[key])
        targets.fit(proto, deploy)  # a cleaned graph that was not verified is fitted here
        if spill is None:
            write_atomically(proto, written)
        else:
            spill.commit(proto)
            report.external_data = os.path.basename(written) + ".data"
    report.timings["total"] = time.perf_counter() - t_start
    return report


def _only_torchscript() -> str:
    return "" if exporters.HAS_DYNAMO else f" ({flags.NO_DYNAMO}: TorchScript only)"


_LOCATION = re.compile(r"\(([^()]+:\d+)\)$")


def _baked_hint(baked: Sequence[str]) -> str:
    """Where the tracer turned a tensor into a Python number: the user's source line that baked a size."""
    places = []
    for text in baked:
        found = _LOCATION.search(text)
        if found and found.group(1) not in places:
            places.append(found.group(1))
    if not places:
        return ""
    more = f" and {len(places) - 1} more" if len(places) > 1 else ""
    return (f" [a size was frozen into the graph by Python code at {places[0]}{more} (TracerWarning: "
            "'Converting a tensor to a Python ...'); compute it with tensor ops there, or let the dynamo "
            "exporter trace it]")


def clean_graph(proto: onnx.ModelProto, weights=None, serialized: Optional[bytes] = None):
    """The cleaned graph and the session that runs it (``cleanup.py``); a bare proto is accepted too."""
    from .cleanup import cleanup_with_session
    return cleanup_with_session(proto, weights, serialized)


def _check_opset(proto: onnx.ModelProto, opset: Optional[int], exporter: str) -> None:
    """``opset=`` is a promise: the dynamo exporter writes 18 when asked for less and its version
    conversion fails, with only a log line to say so."""
    got = next((imp.version for imp in proto.opset_import if imp.domain in ("", "ai.onnx")), None)
    if opset is not None and got != opset:
        raise ExportError(f"{exporter} wrote opset {got}, not the requested opset {opset}")


def _diagnosed(exc, model, inputs, outputs, exporter, examples, sizes, atol, rtol, seed, patches) -> Optional[str]:
    """Wrong numbers at new shapes: the module where they start (``diagnose``), as a culprit line."""
    if not isinstance(exc, VerificationError):
        return None
    from .diagnose import diagnose
    try:
        found = diagnose(model, inputs, outputs, exporter=exporter, examples=examples, sizes=sizes, atol=atol,
                         rtol=rtol, seed=seed, patches=patches)
    except Exception:  # noqa: BLE001 - the verification error stays the error; the diagnosis only helps
        return None
    return found.culprit.line() if found.culprit else None


def _fit_and_verify(proto, deploy, weights=None, serialized=None, **kwargs):
    """Verify the graph as it will be written: fitted to the target first (in place); a graph
    whose weights are in a file is loaded from beside them; ``serialized``, the exporter's bytes
    of this graph, are loaded as they are unless fitting changed it."""
    if targets.fit(proto, deploy):
        serialized = None
    if weights is not None:
        return verify_model(weights.save_graph(proto), **kwargs)
    return verify_model(proto, serialized=serialized, **kwargs)


def _check_dims(proto, specs, stage: str) -> None:
    problems = graph.static_where_dynamic(proto, exporters.wanted_dynamic(specs))
    if problems:
        raise ExportError(stage + "; ".join(problems))


def _wants_cleanup(cleanup: Optional[bool], exporter: str, proto: onnx.ModelProto) -> bool:
    """Default: TorchScript exports, and dynamo exports with recurrent nodes (the gate
    reordering of our LSTM/GRU translation folds away); dynamo optimizes the rest itself."""
    if cleanup is not None:
        return cleanup
    return exporter == "torchscript" or any(n.op_type in ("LSTM", "GRU") for n in proto.graph.node)


def _cleaned(proto, report, specs, check, cases, weights=None, serialized=None):
    """Cleanup, then the dims and (``check``) the numbers of the result. ONNX Runtime cleans the graph
    in a second thread while this one runs the eager model for the reference outputs. Verifying the
    cleaned graph alone suffices; only when it fails is the raw export checked, to say whether the
    export or the cleanup is at fault."""
    t0 = time.perf_counter()
    report.nodes_before_cleanup = len(proto.graph.node)
    with ThreadPoolExecutor(1) as pool:
        cleaning = pool.submit(clean_graph, proto, weights, serialized)
        references = cases() if check is not None else None
        cleaned, sess = cleaning.result(), None
    if isinstance(cleaned, tuple):
        cleaned, sess = cleaned
    if len(cleaned.graph.node) > len(proto.graph.node):  # nothing to fold, only rearranged: keep the export
        cleaned, sess = proto, None
    _check_dims(cleaned, specs, "cleanup lost a dynamic dim: ")
    t1 = time.perf_counter()
    report.timings["cleanup"] = t1 - t0
    results = None
    if check is not None:
        try:
            results = check(cleaned, ort_session=sess, cases=references)  # the session that made the graph runs it
        except VerificationError as exc:
            check(proto, cases=references)  # raises when the export itself is wrong
            raise ExportError(f"cleanup changed the model's outputs: {exc}") from exc
        report.timings["verify"] = time.perf_counter() - t1
    return cleaned, results


def _rasr_names(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> dict:
    data, out = inputs[0], outputs[0]
    return {"features": data.name, "features_size": data.onnx_names[1] if data.lengths else None,
            "output": out.name}


def _metadata(inputs, outputs, exporter: str, user: Optional[Mapping[str, str]]) -> Dict[str, str]:
    entries = {
        "onnx_compat.version": __version__,
        "onnx_compat.exporter": exporter,
        "onnx_compat.inputs": json.dumps([s.describe() for s in inputs]),
        "onnx_compat.outputs": json.dumps([s.describe() for s in outputs]),
        "torch.version": torch.__version__,
        "onnx.version": onnx.__version__,
    }
    entries.update(dict(user or {}))
    return entries
