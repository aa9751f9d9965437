"""ONNX Runtime against the eager model at shapes the export never saw.

The reference is the model's own eager forward, outside every patch: a wrong
patch cannot check itself. Frames beyond each sequence's length are left out
of the comparison (padding is free to differ); the lengths themselves must
match exactly. What is close enough and which reference proves nothing (all
zeros, a constant) is the runtime layer's one rule (``runtimes/compare.py``);
a degenerate output is flagged. A model that draws random numbers is compared
with its eager draws fed to the graph's random nodes (``draw_inputs.py``).
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import onnx
import torch

from onnx_compat.errors import Mismatch, OnnxCompatError, SpecError, VerificationError
from onnx_compat.patches.compiled import uncompiled
from onnx_compat.pipeline import approximate, draw_inputs, float_noise
from onnx_compat.pipeline.adapter import IOAdapter, flatten
from onnx_compat.pipeline.random_draws import live_draws, run_recording
from onnx_compat.pipeline.subject import own_copies
from onnx_compat.runtimes import as_runtimes
from onnx_compat.runtimes.compare import closeness, degenerate, valid_mask
from onnx_compat.runtimes.session import is_session, open_session
from onnx_compat.model_state import preserved
from onnx_compat.spec import FarSizes, TensorSpec, check_examples, dim_sizes, example_sizes, forward_arguments, make_inputs, size_name, verification_sizes


@dataclass
class OutputCheck:
    name: str
    max_abs_err: float
    max_rel_err: float
    ok: bool
    degenerate: bool = False
    float32_noise: Optional[float] = None  # passed against the float64 model, within eager's own float32 error
    max_abs_err_float64: Optional[float] = None  # the graph's largest error against that float64 result


@dataclass
class ShapeCheck:
    sizes: Dict[str, int]
    outputs: List[OutputCheck] = field(default_factory=list)
    error: Optional[str] = None
    failure: Optional[str] = None  # with ``error``: "run", "length", "shape" or "draws"
    example: bool = False  # on a user example rather than generated inputs
    runtime: Optional[str] = None  # None: this process's ONNX Runtime; else e.g. "onnxruntime 1.16.3 (Python: ...)"
    draws: List[str] = field(default_factory=list)  # each random node and the eager draw it was fed

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.ok for o in self.outputs)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def compare(got: np.ndarray, expected: np.ndarray, mask: np.ndarray, name: str, atol: float, rtol: float) -> OutputCheck:
    """One output by the runtime layer's rule (``runtimes.compare``), its reference judged there too."""
    close = closeness(got, expected, atol, rtol, mask)
    return OutputCheck(name, close.max_abs_err, close.max_rel_err, close.ok,
                       degenerate=degenerate(expected[mask]) is not None)


Runner = Callable[[Dict[str, np.ndarray]], Dict[str, np.ndarray]]  # feeds by name -> outputs by name


def local_runner(sess) -> Runner:
    names, wanted = [o.name for o in sess.get_outputs()], {i.name for i in sess.get_inputs()}
    return lambda feeds: dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted})))


@dataclass
class Case:
    """One verification input and the eager model's outputs on it (the reference, computed once)."""

    sizes: Dict[str, int]
    feeds: Dict[str, torch.Tensor]
    example: bool = False  # a user example rather than generated inputs
    expected: List[np.ndarray] = field(default_factory=list)
    draws: list = field(default_factory=list)  # the eager run's draws (``random_draws.Draw``), in call order
    optional: bool = False  # a far check (``spec.FarSizes``): dropped if the eager model refuses it
    refused: str = ""  # why the eager model refused an optional case ("ValueError: ...")


def reference_cases(model: torch.nn.Module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                    sizes: Optional[List[Dict[str, int]]] = None, example: Optional[Mapping[str, int]] = None,
                    seed: int = 1, examples=None, first_example_outputs: Optional[list] = None,
                    drawing: bool = False, notes: Optional[List[str]] = None) -> List[Case]:
    """The inputs ``verify`` checks (three shapes around ``example``, B=1 first, then each user example)
    with the unpatched eager model's outputs on them. Independent of the ONNX graph, so it can run while
    ONNX Runtime loads or optimises it. ``first_example_outputs``: the eager outputs on the first user
    example, already computed (``Subject.check_outputs`` runs the model on it): used, not computed again.
    Each case keeps the draws its run made (``random_draws.run_recording``; ``drawing``: the model is known
    to draw, each run is recorded from the model as it was). A far check the model refuses is dropped, and
    ``notes`` (the report's findings) says so."""
    checked = check_examples(inputs, examples)
    if sizes is None:
        sizes = verification_sizes(inputs, example or dim_sizes(inputs))
    cases = [Case(dict(s), make_inputs(inputs, s, seed=seed + k), optional=isinstance(s, FarSizes))
             for k, s in enumerate(sizes)]
    cases += [Case(example_sizes(inputs, feeds), feeds, example=True) for feeds in checked]
    # eval mode; flags, attributes and buffers as before afterwards; compiled functions as their plain Python
    with preserved(model), torch.no_grad(), uncompiled():
        reference = IOAdapter(model, forward_arguments(model, inputs), outputs)

        def run(case: Case) -> None:
            # its own copies: a model writing into its input would change what ONNX Runtime is fed next
            returned, case.draws = run_recording(lambda: flatten(reference(*own_copies(case.feeds.values()))),
                                                 lambda: preserved(model), drawing)
            case.expected = [t.detach().cpu().numpy() for t in returned]
        for case in cases:
            if case.example and first_example_outputs is not None and case.feeds is checked[0]:
                case.expected = list(first_example_outputs)
                continue
            _run_accepted(run, case, inputs)
    for case in cases:
        said = f"far check at {case.sizes} not made: the eager model itself refused it ({case.refused})"
        if case.refused and notes is not None and said not in notes:
            notes.append(said)
    return [case for case in cases if not (case.optional and not case.expected)]


def _run_accepted(run: Callable[[Case], None], case: Case, inputs: Sequence[TensorSpec]) -> None:
    """``run(case)``, the eager reference. A generated case the model refuses is drawn again with its lengths
    longest first, as every padded batch can be ordered (a model packing with ``pack_padded_sequence(...,
    enforce_sorted=True)`` refuses lengths in any other order); a refusal of that too is the model's: a
    ``SpecError`` says the eager model, not the exported graph, refused the inputs (issue #47, 1)."""
    try:
        return run(case)
    except OnnxCompatError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's own error, named below
        if case.optional:  # a far check the model does not take (a table it holds only so long): not made
            case.refused = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            return None
        refused = exc
    drawn, ordered = case.feeds, None if case.example else _longest_first(case.feeds, inputs)
    if ordered is not None:
        case.feeds = ordered
        try:
            return run(case)
        except Exception:  # noqa: BLE001 - refused in that order too: the first refusal is reported
            case.feeds = drawn
    what = "the example" if case.example else \
        f"the inputs drawn for verification{' (lengths also tried longest first)' if ordered is not None else ''}"
    line = (str(refused).strip().splitlines() or [""])[0]
    raise SpecError(f"the eager model itself (unpatched, before any exported graph ran) refused {what} at sizes "
                    f"{case.sizes}: {type(refused).__name__}: {line} -- the model, not the graph, refused them; "
                    f"declare what it accepts (values=, lengths) or pass examples= it accepts") from refused


def _longest_first(feeds: Dict[str, torch.Tensor], inputs: Sequence[TensorSpec]) -> Optional[Dict[str, torch.Tensor]]:
    """``feeds`` with each lengths input sorted longest first; None when every one already is."""
    names = {size_name(spec.name, axis) for spec in inputs for axis in spec.lengths}
    out, changed = dict(feeds), False
    for name in names & set(feeds):
        lengths = feeds[name]
        ordered = torch.sort(lengths, descending=True, stable=True).values
        if not torch.equal(ordered, lengths):
            out[name], changed = ordered, True
    return out if changed else None


def check_at(run: Runner, case: Case, outputs: Sequence[TensorSpec], atol: float, rtol: float,
             runtime: Optional[str] = None) -> ShapeCheck:
    """ONNX Runtime (``run``) against the eager reference of ``case``."""
    if is_session(run):
        run = local_runner(run)
    result = ShapeCheck(dict(case.sizes), example=case.example, runtime=runtime)
    sizes, expected = case.sizes, case.expected
    try:
        by_name = run({k: v.numpy() for k, v in case.feeds.items()})
    except draw_inputs.DrawsDiffer as exc:
        result.error, result.failure = str(exc), "draws"
        return result
    except Exception as exc:
        result.error = f"{runtime or 'ONNX Runtime'} run failed: {str(exc).splitlines()[0]}"
        result.failure = "run"
        return result
    i = 0
    for spec in outputs:
        exp, ort_out = expected[i], by_name.get(spec.name)
        lengths = {}
        for k, axis in enumerate(spec.lengths):
            lname = size_name(spec.name, axis)
            exp_len, got_len = expected[i + 1 + k], by_name.get(lname)
            if got_len is None or not np.array_equal(np.asarray(got_len), exp_len):
                result.error = f"output {lname!r} differs: ONNX {None if got_len is None else got_len.tolist()}, eager {exp_len.tolist()}"
                result.failure = "length"
                return result
            lengths[axis] = exp_len
        if ort_out is None or ort_out.shape != exp.shape:
            result.error = (f"output {spec.name!r} has shape {None if ort_out is None else list(ort_out.shape)} in ONNX "
                            f"but {list(exp.shape)} in eager at sizes {sizes}")
            result.failure = "shape"
            return result
        result.outputs.append(compare(ort_out, exp, valid_mask(exp.shape, lengths), spec.name, atol, rtol))
        i += 1 + len(spec.lengths)
    return result


def verify(onnx_model: Union[str, os.PathLike, onnx.ModelProto], model: torch.nn.Module,
           inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *, sizes: Optional[List[Dict[str, int]]] = None,
           example: Optional[Mapping[str, int]] = None, atol: float = 1e-4, rtol: float = 1e-3, seed: int = 1,
           raise_on_failure: bool = True, examples=None, runtimes=(),
           ort_session=None, cases: Optional[List[Case]] = None,
           serialized: Optional[bytes] = None, drawing: bool = False) -> List[ShapeCheck]:
    """Check ``onnx_model`` (path or proto) against ``model`` in eager mode.

    ``sizes``: the named dim sizes to run at (default: three shapes around
    ``example``, B=1 first). ``examples``: real inputs ``[{onnx_name: tensor}]``,
    each checked too (after the generated shapes). ``runtimes``: other ONNX
    Runtimes to run the same checks in (another venv's interpreter path,
    ``"node:<folder>"`` for onnxruntime-node, or ``runtimes.Runtime``); their
    checks follow this process's, marked with the runtime. Raises
    ``VerificationError`` naming the output, the shape and the runtime on the
    first failure unless ``raise_on_failure=False``. ``ort_session``: an ONNX Runtime
    session already made from ``onnx_model`` to run the checks in. ``cases``: the
    ``reference_cases`` already computed (else they are, while ONNX Runtime loads the model).
    ``serialized``: ``onnx_model`` as bytes already (the exporter's own), checked and loaded as they are.
    A model that draws random numbers is verified with its eager draws fed to the graph's random nodes
    (``draw_inputs.py``), paired in the graph's order, the model's call order as exported; ``drawing``: the
    model is known to draw (``Subject.draws``), each reference run is recorded from the model as it was.
    """
    others = as_runtimes(runtimes)
    check_examples(inputs, examples)  # a malformed example is the error, before anything loads
    if sizes is None and cases is None:
        sizes = with_remainders(onnx_model, inputs, example or dim_sizes(inputs))
    sess, cases = _session_and_cases(onnx_model, serialized, ort_session, cases, lambda: reference_cases(
        model, inputs, outputs, sizes=sizes, example=example, seed=seed, examples=examples, drawing=drawing))
    fed = _draws_fed(onnx_model, serialized, cases, lambda case: _live(model, inputs, outputs, case))
    try:
        results = _checked(sess, onnx_model, fed, others, cases, outputs, atol, rtol)
        if fed is None:
            results = _float64_judged(sess, onnx_model, model, inputs, outputs, cases, results, atol, rtol)
    finally:
        if fed is not None:
            fed.close()
    failed = next((r for r in results if not r.ok), None)
    if raise_on_failure and failed is not None:
        note = _undrawn(fed, cases)
        if failed.failure in (None, "values"):  # a quantized file misses atol by design: say so
            note += approximate.note(onnx_model)
        raise _error(failed, atol, rtol, note)
    return results


def with_remainders(onnx_model, inputs: Sequence[TensorSpec], example: Mapping[str, int]) -> Optional[list]:
    """The default shapes and one at a multiple of each constant divisor of a size's remainder in the graph (a
    ``Mod`` of a ``Shape``, ``size_remainders.py``), or None (the default three) when it holds none: a plain
    export verified by hand is held to the same shapes as the pipeline's."""
    from onnx_compat.pipeline import size_remainders
    if isinstance(onnx_model, onnx.ModelProto):
        proto = onnx_model
    elif isinstance(onnx_model, (str, os.PathLike)):
        proto = onnx.load(os.fspath(onnx_model), load_external_data=False)
    else:
        return None
    return size_remainders.shapes(inputs, example, size_remainders.divisors_in_graph(proto))


def _session_and_cases(onnx_model, serialized, ort_session, cases, references: Callable[[], List[Case]]):
    """An ONNX Runtime session of the graph (``ort_session`` if given) and the eager reference cases (``cases`` if
    given, else ``references()``), the two computed side by side: loading a large graph and running the model at
    the verification shapes take about as long each. A graph that does not load is the error."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(references) if cases is None else None
        try:
            if ort_session is None:  # a session given has loaded the graph already
                loadable = serialized if serialized is not None else \
                    onnx_model if isinstance(onnx_model, onnx.ModelProto) else os.fspath(onnx_model)
                onnx.checker.check_model(loadable, full_check=True)
                sess = open_session(loadable, prepack=False)
            else:
                sess = ort_session
        except Exception as exc:
            if pending is not None:
                pending.cancel()
            reason = f"the ONNX model does not load: {str(exc).splitlines()[0]}"
            raise VerificationError(reason, Mismatch({}, reason, kind="load")) from exc
        return sess, (pending.result() if pending is not None else cases)


def _float64_judged(sess, onnx_model, model, inputs, outputs, cases: List[Case], results: List[ShapeCheck],
                    atol: float, rtol: float) -> List[ShapeCheck]:
    """This process's checks that failed on values alone (every shape and length right), each judged again
    against the model's float64 result (``float_noise.py``); a quantized file keeps its failure (its own
    measures judge it), and so does a check asked with no tolerance at all (``atol=rtol=0``: eager's own
    float32 numbers, exactly, are what the caller wants matched)."""
    failed = [k for k, r in enumerate(results[:len(cases)]) if r.error is None and not r.ok]
    if not failed or approximate.read(onnx_model) is not None or (atol == 0 and rtol == 0):
        return results
    run, judged = local_runner(sess), list(results)
    for k in failed:
        exact = float_noise.float64_outputs(model, inputs, outputs, cases[k].feeds)
        if exact is None:  # the model does not run in float64: nothing to judge against
            break
        got = float_noise.outputs_of(run, cases[k].feeds, outputs)
        judged[k] = float_noise.rejudged(results[k], got, cases[k].expected, exact, outputs, atol, rtol)
    return judged


def _draws_fed(onnx_model, serialized, cases: List[Case], live) -> Optional[draw_inputs.Substitution]:
    """The verification copy taking eager's draws, when the model drew (``draw_inputs.substitution``); a
    graph whose draws cannot take eager's is a failed verification of kind "draws"."""
    try:
        return draw_inputs.substitution(onnx_model, serialized, cases, live)
    except draw_inputs.DrawsDiffer as exc:
        reason = f"the model draws random numbers, and {exc}"
        raise VerificationError(reason, Mismatch({}, reason, kind="draws")) from exc


def _live(model, inputs, outputs, case: Case) -> List[bool]:
    """Which of the case's draws its outputs depend on (``random_draws.live_draws``), the model run as the
    reference is."""
    feeds = case.feeds.values()
    with preserved(model), torch.no_grad(), uncompiled():
        reference = IOAdapter(model, forward_arguments(model, inputs), outputs)
        return live_draws(lambda: flatten(reference(*own_copies(feeds))), lambda: preserved(model), case.draws,
                          [torch.from_numpy(np.asarray(e)) for e in case.expected])


def _checked(sess, onnx_model, fed: Optional[draw_inputs.Substitution], others, cases: List[Case], outputs,
             atol: float, rtol: float) -> List[ShapeCheck]:
    """Every case in this process's ONNX Runtime, then in the others; with draws fed, in the copy's session
    (the graph's own session cannot take them), each case's draws fed to the random nodes."""
    if fed is None:
        results = [check_at(sess, case, outputs, atol, rtol) for case in cases]
        return results + (_in_runtimes(onnx_model, others, cases, outputs, atol, rtol) if others else [])
    run = local_runner(open_session(fed.model, prepack=False))
    results = [check_at(fed.runner(run, case), case, outputs, atol, rtol) for case in cases]
    if others:
        results += _in_runtimes(fed.model, others, cases, outputs, atol, rtol, fed=fed)
    for result, case in zip(results, cases * (1 + len(others))):
        result.draws = fed.described(case)
    return results


def _undrawn(fed: Optional[draw_inputs.Substitution], cases: List[Case]) -> str:
    """What a failure of a model that drew, checked against a graph with no random node, most likely is."""
    drew = [d for case in cases for d in case.draws]
    if fed is not None or not drew:
        return ""
    sites = "; ".join(dict.fromkeys(d.site for d in drew))
    return (f" [the model draws random numbers ({sites}) and the graph holds no random node: a draw the outputs "
            f"depend on was frozen into the graph as the example's numbers, or dropped]")


def _error(failed: ShapeCheck, atol: float, rtol: float, note: str = "") -> VerificationError:
    """The first failed check as an error naming the sizes, the runtime and the outputs (``note``: what the
    failure most likely is); its ``mismatch`` says whether only the tolerance was missed (every shape and
    length agreed)."""
    bad = [o for o in failed.outputs if not o.ok]
    reason = failed.error or "; ".join(f"output {o.name!r} max abs err {o.max_abs_err:.3g} (atol {atol}, rtol {rtol})"
                                       for o in bad)
    reason += note
    where = f" in {failed.runtime}" if failed.runtime else ""
    mismatch = Mismatch(dict(failed.sizes), reason, failed.runtime, failed.example, [o.name for o in bad],
                        max((o.max_abs_err for o in bad), default=None), kind=failed.failure or "values")
    return VerificationError(f"{'on the example' if failed.example else 'at'} sizes {failed.sizes}{where}: {reason}",
                             mismatch)


def _in_runtimes(onnx_model, others, cases: List[Case], outputs, atol, rtol, fed=None) -> List[ShapeCheck]:
    """The same checks in each other runtime, which loads the model from a file as a deployment does."""
    results = []
    with tempfile.TemporaryDirectory(prefix="onnx_compat_verify_") as folder:
        path = onnx_model
        if isinstance(onnx_model, onnx.ModelProto):
            path = os.path.join(folder, "model.onnx")
            onnx.save(onnx_model, path)
        for rt in others:
            def run(feeds, rt=rt):
                return rt.run(os.fspath(path), feeds)
            results += [check_at(fed.runner(run, case) if fed is not None else run, case, outputs, atol, rtol,
                                 runtime=rt.name) for case in cases]
    return results
