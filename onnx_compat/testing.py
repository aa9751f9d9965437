"""Test support for patches: ONNX Runtime against the unpatched eager model, and a table of patch cases.

A patch is only proven when the exported graph gives eager's numbers at sizes the export never saw
(B=1 among them) and the same model exported without the patch fails in the way recorded for it, so
that the patched test cannot pass by accident. Every patch family needs both tests; ``PatchCase``
holds what differs between families and ``patch_case_tests`` writes the two tests once.

pytest is imported only by ``patch_case_tests``, so ``assert_matches_eager`` works in any script.
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
import torch

from onnx_compat import versions
from onnx_compat.errors import EagerMismatch  # in the one family; importable from here as before
from onnx_compat.runtimes import compare as compare_rule
from onnx_compat.runtimes.session import open_session
from onnx_compat.pipeline.vanilla import plain_export

EXPORTERS = ("torchscript", "dynamo") if versions.HAS_DYNAMO else ("torchscript",)

DEGENERATE_SPREAD = compare_rule.DEGENERATE_SPREAD  # the runtime layer's degenerate rule (runtimes/compare.py)

Sizes = Mapping[str, int]
Check = Tuple[Sizes, Sequence[torch.Tensor]]


def seed_of(name: str) -> int:
    """A seed from a case's name that is the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(name.encode()) % 2**31


def at(sizes: Sizes) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def assert_not_degenerate(reference: np.ndarray, where: str) -> None:
    """A comparison with an all-zero (or constant) reference passes for any graph that also gives it
    (the rule: ``runtimes.compare.degenerate``)."""
    why = compare_rule.degenerate(reference)
    if why is not None:
        raise AssertionError(f"{where}: degenerate reference output: {why}")


def session_of(proto_or_session: Union[onnx.ModelProto, bytes, str, Any]):
    """A session of a graph (a session passes through), with ONNX Runtime's default threads."""
    return open_session(proto_or_session, threads=None, quiet=False)


def eager_outputs(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list:
    with torch.no_grad():
        out = model(*inputs)
    # a gradient taken inside forward with create_graph=True needs grad even under no_grad
    return [t.detach().numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def runtime_outputs(session, inputs: Sequence[torch.Tensor], where: str = "") -> list:
    """ONNX Runtime's outputs; its own error keeps its type and text (recorded failures match on them),
    with a note saying where it happened (Python 3.11+ shows notes)."""
    feeds = {i.name: np.asarray(x) for i, x in zip(session.get_inputs(), inputs)}
    try:
        return session.run(None, feeds)
    except Exception as exc:
        if where and hasattr(exc, "add_note"):
            exc.add_note(f"ONNX Runtime failed {where}")
        raise


def bare_onnx(model: torch.nn.Module, args: Sequence[torch.Tensor], exporter: str,
              dynamic: Mapping[int, Mapping[int, str]], names: Optional[Sequence[str]] = None) -> onnx.ModelProto:
    """A bare ``torch.onnx.export`` (no cleanup, no verification) as a ModelProto, to judge one exporter.

    ``dynamic`` maps each input index to ``{axis: name}``; ``names`` are the input names (default x0, x1, ...).
    """
    names = list(names or [f"x{i}" for i in range(len(args))])
    return plain_export(model, tuple(args), exporter, names, {names[i]: axes for i, axes in dynamic.items()},
                        output_names=["y"])


def allclose(got: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> None:
    """The runtime layer's one rule (``runtimes.compare.closeness``) as an assertion."""
    close = compare_rule.closeness(got, expected, atol, rtol)
    if not close.ok:
        raise AssertionError(close.describe(atol, rtol))


def _max_error(got: np.ndarray, expected: np.ndarray) -> float:
    return compare_rule.closeness(got, expected, 0.0, 0.0).max_abs_err


def _compare_output(got, expected, name, sizes, output, *, keep, atol, rtol, scaled, compare):
    """One output: same shape, a reference that is not degenerate, then the numbers."""
    place = f"at {at(sizes)}" + (f" (output {output})" if output is not None else "")
    fields = dict(case=name, sizes=sizes, output=output)
    if got.shape != expected.shape:
        raise EagerMismatch(f"{name}: ONNX Runtime gives shape {tuple(got.shape)}, eager {tuple(expected.shape)} "
                            f"{place}", **fields)
    if keep is not None:
        got, expected = got[keep], expected[keep]
    try:
        assert_not_degenerate(expected, f"{name} {place}")
    except AssertionError as exc:
        raise EagerMismatch(str(exc), **fields) from None
    tol = atol * compare_rule.magnitude(expected) if scaled else atol
    try:
        compare(got, expected, tol, rtol)
    except AssertionError as exc:
        error = _max_error(got, expected)
        raise EagerMismatch(f"{name}: ONNX Runtime differs from eager {place}: max abs err {error:.3g} "
                            f"(atol {tol:.3g}, rtol {rtol:g})\n{exc}", max_error=error, atol=tol, rtol=rtol,
                            **fields) from None


def assert_matches_eager(proto_or_session, model: torch.nn.Module, cases: Iterable[Check], *, atol: float,
                         rtol: float, name: str, scaled: bool = False,
                         keep: Optional[Callable[[Sequence[torch.Tensor]], Any]] = None,
                         compare: Callable = allclose,
                         also: Optional[Callable[[list, list, Sequence[torch.Tensor]], None]] = None) -> None:
    """ONNX Runtime equals eager ``model`` (run as given: unpatched) on every ``(sizes, inputs)`` case.

    A failure names ``name``, the sizes and the output. ``scaled``: ``atol`` is a fraction of the
    reference's largest magnitude; ``keep(inputs)``: the elements compared (e.g. valid frames);
    ``compare``: the numeric check; ``also``: further assertions on ``(got, expected, inputs)``.
    """
    session = session_of(proto_or_session)
    for sizes, inputs in cases:
        expected, got = eager_outputs(model, inputs), runtime_outputs(session, inputs, f"in {name} at {at(sizes)}")
        if len(got) != len(expected):
            raise EagerMismatch(f"{name}: ONNX Runtime gives {len(got)} outputs, eager {len(expected)} "
                                f"at {at(sizes)}", case=name, sizes=sizes)
        mask = keep(inputs) if keep else None
        for index, (g, e) in enumerate(zip(got, expected)):
            _compare_output(g, e, name, sizes, index if len(got) > 1 else None, keep=mask, atol=atol, rtol=rtol,
                            scaled=scaled, compare=compare)
        if also:
            try:
                also(got, expected, inputs)
            except AssertionError as exc:
                raise EagerMismatch(f"{name}: at {at(sizes)}: {exc}", case=name, sizes=sizes) from None


def assert_fails_as_recorded(check: Callable[[], Any], expected: Union[str, Tuple[str, ...]]) -> None:
    """``check()`` (an unpatched export and its comparison with eager) fails, and how: one of ``expected``
    (older releases may fail earlier) is in the error text, prefixed "mismatch: " for wrong numbers."""
    try:
        check()
    except AssertionError as exc:
        message = "mismatch: " + str(exc)
    except Exception as exc:  # export or ONNX Runtime error
        message = str(exc)
    else:
        raise AssertionError("the unpatched export worked; the patch is not needed here")
    texts = (expected,) if isinstance(expected, str) else expected
    assert any(text in message for text in texts), message[:500]


def _always(exporter: str) -> bool:
    return True


def _never(exporter: str) -> Optional[str]:
    return None


@dataclass(frozen=True)
class PatchCase:
    """One model a patch family must export: how to build it, feed it, export it and judge it.

    ``inputs(batch, time, seed)`` gives the model's positional inputs; ``dynamic`` maps an input
    index to ``{axis: name}``; ``sizes`` are the (batch, time) pairs checked, none of them the
    ``example`` exported at; ``exporters``: the ones the case runs with (a pattern dynamo exports by
    itself needs no ~5 s dynamo export per run); ``vanilla`` maps an exporter to how the unpatched export
    fails (text in the error, "mismatch" for wrong numbers), ``unpatched()`` is the context that export
    runs in (no patches; or ``patched(exclude=[...])`` when the failure is the one patch's);
    ``fails_here(exporter)``: whether this torch has that failure; ``skip(exporter)``: why this torch
    cannot run the case at all, or None.
    """
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int, int], Sequence[torch.Tensor]]
    dynamic: Mapping[int, Mapping[int, str]]
    sizes: Sequence[Tuple[int, int]] = ((1, 23), (3, 50), (2, 9))
    example: Tuple[int, int] = (2, 37)
    size_names: Tuple[str, str] = ("batch", "time")
    vanilla: Mapping[str, Union[str, Tuple[str, ...]]] = field(default_factory=dict)
    fails_here: Callable[[str], bool] = _always
    skip: Callable[[str], Optional[str]] = _never
    atol: float = 1e-5
    rtol: float = 1e-4
    scaled: bool = False  # atol is a fraction of the reference's largest magnitude
    grad_mode: Callable[[], Any] = torch.no_grad  # the autograd mode the export runs under
    keep: Optional[Callable] = None
    compare: Callable = allclose
    also: Optional[Callable] = None
    graph: Optional[Callable[[onnx.ModelProto, str], None]] = None  # assertions on the patched graph
    exporters: Tuple[str, ...] = ("torchscript", "dynamo")
    unpatched: Callable[[], Any] = contextlib.nullcontext

    def model(self) -> torch.nn.Module:
        torch.manual_seed(seed_of(self.name))
        return self.build().eval()

    def export(self, model: torch.nn.Module, exporter: str) -> onnx.ModelProto:
        """A bare ``torch.onnx.export`` at the example size (inside ``patched()`` or not: the caller's choice)."""
        with self.grad_mode():
            return bare_onnx(model, self.inputs(*self.example, 0), exporter, self.dynamic)

    def checks(self) -> list:
        """(sizes, inputs) at each checked size; seed 0 is the example's, so every check has its own."""
        return [(dict(zip(self.size_names, bt)), tuple(self.inputs(*bt, seed)))
                for seed, bt in enumerate(self.sizes, start=1)]

    def assert_matches(self, proto, model) -> None:
        assert_matches_eager(proto, model, self.checks(), atol=self.atol, rtol=self.rtol, name=self.name,
                             scaled=self.scaled, keep=self.keep, compare=self.compare, also=self.also)

    def assert_eager_untouched(self) -> None:
        """Inside ``patched()`` but not exporting, the model computes bit for bit what it computes outside."""
        import onnx_compat
        model, inputs = self.model(), self.inputs(3, 20, 5)
        with torch.no_grad():
            expected = eager_outputs(model, inputs)
            with onnx_compat.patched():
                got = eager_outputs(model, inputs)
        for index, (g, e) in enumerate(zip(got, expected)):
            assert np.array_equal(g, e, equal_nan=True), f"{self.name}: output {index} differs inside patched()"
        assert len(got) == len(expected)


def case_id(case: PatchCase, exporter: str) -> str:
    return f"{case.name}-{exporter}"


def patch_case_tests(cases: Sequence[PatchCase]):
    """The two tests of a patch family, parametrized over ``cases`` x exporters with ids "name-exporter":
    the patched export matches eager; the unpatched export fails as recorded (where this torch fails)."""
    import pytest
    import onnx_compat

    def skip_if_unsupported(case, exporter):
        reason = case.skip(exporter)
        if reason:
            pytest.skip(reason)

    ran = [pytest.param(c, e, id=case_id(c, e)) for c in cases for e in EXPORTERS if e in c.exporters]

    @pytest.mark.parametrize("case,exporter", ran)
    def test_patched_export_matches_eager(case, exporter):
        skip_if_unsupported(case, exporter)
        model = case.model()
        with onnx_compat.patched():
            proto = case.export(model, exporter)
        case.assert_matches(proto, model)
        if case.graph:
            case.graph(proto, exporter)

    recorded = [pytest.param(c, e, id=case_id(c, e)) for c in cases for e in sorted(c.vanilla) if e in c.exporters]

    @pytest.mark.parametrize("case,exporter", recorded)
    def test_vanilla_export_fails_as_recorded(case, exporter):
        """Without the patches these cases break, so the patched tests cannot pass by accident."""
        if exporter not in EXPORTERS:
            pytest.skip(versions.NO_DYNAMO)
        skip_if_unsupported(case, exporter)
        if not case.fails_here(exporter):
            pytest.skip(f"torch {torch.__version__}'s unpatched {exporter} export of {case.name} "
                        "does not have the recorded failure")
        model = case.model()
        with case.unpatched():
            assert_fails_as_recorded(lambda: case.assert_matches(case.export(model, exporter), model),
                                     case.vanilla[exporter])

    return test_patched_export_matches_eager, test_vanilla_export_fails_as_recorded


GRAD_MODES: Dict[str, Callable[[], Any]] = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                                            "grad": contextlib.nullcontext}
