"""Every error a user can cause is an ``OnnxCompatError`` importable from ``onnx_compat.errors`` and names the
culprit; no old import path shadows a public function; Ctrl-C is never an export failure."""
import importlib
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec, errors
from onnx_compat.errors import OnnxCompatError


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


def _specs():
    return [TensorSpec("x", [Dim("batch"), 4])], [TensorSpec("y", [Dim("batch"), 3])]


def _export(tmp, **kw):
    inputs, outputs = _specs()
    args = dict(model=Linear(), path=str(tmp / "m.onnx"), inputs=inputs, outputs=outputs)
    args.update(kw)
    return onnx_compat.export(args.pop("model"), args.pop("path"), args.pop("inputs"), args.pop("outputs"), **args)


def _streaming(tmp, **kw):
    from onnx_compat import StateSpec
    args = dict(step=nn.GRUCell(4, 4), path=str(tmp / "s.onnx"), inputs=TensorSpec("x", [Dim("batch"), 4]),
                states=[StateSpec("h", [Dim("batch"), 4])], outputs=TensorSpec("y", [Dim("batch"), 4]))
    args.update(kw)
    return onnx_compat.export_streaming(args.pop("step"), args.pop("path"), args.pop("inputs"), args.pop("states"),
                                        args.pop("outputs"), **args)


# (what is wrong, the call, the culprit the message names, the built-in the error also is)
BAD_INPUTS = [
    ("exporter", lambda t: _export(t, exporter="bogus"), "'bogus'", ValueError),
    ("contract", lambda t: _export(t, contract="nope"), "'nope'", ValueError),
    ("runtimes", lambda t: _export(t, runtimes=[42]), "42", TypeError),
    ("model", lambda t: _export(t, model="not a module"), "model", TypeError),
    ("inputs", lambda t: _export(t, inputs=[]), "inputs", TypeError),
    ("out is a folder", lambda t: _export(t, path=str(t)), "is a directory", ValueError),
    ("out folder missing", lambda t: _export(t, path=str(t / "no" / "m.onnx")), "does not exist", ValueError),
    ("sizes typo", lambda t: _export(t, sizes={"frames": 100}), "'frames'", ValueError),
    ("quantize without verify", lambda t: _export(t, quantize="int8-dynamic", verify=False), "verify=True",
     ValueError),
    ("patches not a dict", lambda t: _export(t, patches=True), "patches=", TypeError),
    ("patches option misspelt", lambda t: _export(t, patches={"exlude": ["conv_padding"]}), "exlude", TypeError),
    ("patches unknown name", lambda t: _export(t, patches={"exclude": ["nope"]}), "'nope'", ValueError),
    ("patched only", lambda t: onnx_compat.patched(only=["nope"]), "'nope'", ValueError),
    ("patched string", lambda t: onnx_compat.patched(only="conv_padding"), "list", TypeError),
    ("Dim name", lambda t: Dim(""), "name", ValueError),
    ("Dim min", lambda t: Dim("t", min=0), "'t'", ValueError),
    ("describe missing file", lambda t: onnx_compat.describe(str(t / "missing.onnx")), "missing.onnx", ValueError),
    ("streaming exporter", lambda t: _streaming(t, exporter="bogus"), "'bogus'", ValueError),
    ("streaming step", lambda t: _streaming(t, step=42), "step", TypeError),
]


@pytest.mark.parametrize("call, culprit, builtin", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_onnx_compat_error_naming_the_culprit(call, culprit, builtin, tmp_path):
    with pytest.raises(OnnxCompatError) as caught:
        call(tmp_path)
    assert culprit in str(caught.value), str(caught.value)
    assert isinstance(caught.value, builtin), type(caught.value).__mro__  # ``except ValueError`` keeps working
    assert list(tmp_path.glob("*.onnx")) == []


def test_argument_errors_carry_the_argument_as_a_field(tmp_path):
    with pytest.raises(errors.ArgumentError) as caught:
        _export(tmp_path, exporter="bogus")
    assert (caught.value.argument, caught.value.value) == ("exporter", "bogus")
    with pytest.raises(errors.PatchError) as caught:
        onnx_compat.patched(only=["nope"])
    assert caught.value.patch == "nope"


def test_a_corrupt_model_file_is_named(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage\xff\xff" * 4)
    with pytest.raises(errors.ModelFileError, match="bad.onnx") as caught:
        onnx_compat.describe(str(bad))
    assert caught.value.path == str(bad)


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_importable_from_errors(name):
    value = getattr(errors, name)
    if isinstance(value, type) and issubclass(value, BaseException):
        assert issubclass(value, OnnxCompatError), name


def test_errors_raised_by_public_calls_are_in_errors():
    from onnx_compat.contracts import ConsumerMismatch, ContractError
    from onnx_compat.huggingface.errors import HFError, UncoveredModelError
    from onnx_compat.quantization import QuantizationError
    from onnx_compat.streaming import StreamingError
    for cls in (ConsumerMismatch, ContractError, HFError, UncoveredModelError, QuantizationError, StreamingError):
        assert getattr(errors, cls.__name__) is cls and cls.__name__ in errors.__all__


def test_every_onnx_compat_error_class_in_the_package_is_in_errors():
    """A new layer's error class that is not re-exported from ``onnx_compat.errors`` is found here."""
    import pkgutil
    for info in pkgutil.walk_packages(onnx_compat.__path__, "onnx_compat."):
        if not info.name.startswith(("onnx_compat.models", "onnx_compat.demo")):
            importlib.import_module(info.name)

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)
    found = {c for c in below(OnnxCompatError) if c.__module__.startswith("onnx_compat.")}
    missing = sorted(c.__name__ for c in found if getattr(errors, c.__name__, None) is not c)
    assert missing == [], f"add to onnx_compat.errors: {missing}"


def _package_exceptions():
    """Every exception class defined in the package (every module imported; the bundled models and the demo
    aside, as in the test above)."""
    import pkgutil
    for info in pkgutil.walk_packages(onnx_compat.__path__, "onnx_compat."):
        if not info.name.startswith(("onnx_compat.models", "onnx_compat.demo")):
            importlib.import_module(info.name)

    def below(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)
    return {c for c in below(BaseException) if c.__module__.startswith("onnx_compat.")}


def test_every_exception_class_of_the_package_is_in_the_family():
    """Issue #45: ``DataDependentBranch`` (a RuntimeError), ``DrawsDiffer`` (an Exception) and ``EagerMismatch`` (an
    AssertionError) were defined outside ``OnnxCompatError``: a user's ``except OnnxCompatError`` missed them.
    Warning classes are not errors (``warnings.warn`` issues them) and stay out."""
    outside = sorted(f"{c.__module__}.{c.__name__}" for c in _package_exceptions()
                     if not issubclass(c, (OnnxCompatError, Warning)))  # a warning is issued, never raised
    assert outside == [], f"derive from onnx_compat.errors.OnnxCompatError: {outside}"


@pytest.mark.parametrize("old, name, builtin", [("onnx_compat.patches.checks", "DataDependentBranch", RuntimeError),
                                                ("onnx_compat.pipeline.draw_inputs", "DrawsDiffer", Exception),
                                                ("onnx_compat.testing", "EagerMismatch", AssertionError)])
def test_the_errors_brought_into_the_family_keep_their_old_paths_and_bases(old, name, builtin):
    """Moved into ``onnx_compat.errors``: still importable where they were, still caught as what they were."""
    cls = getattr(importlib.import_module(old), name)
    assert cls is getattr(errors, name) and issubclass(cls, (OnnxCompatError, builtin)) and issubclass(cls, builtin)
    assert name in errors.__all__


def test_data_dependent_branch_names_the_line_and_keeps_the_cause():
    cause = RuntimeError("Could not guard on data-dependent expression")
    exc = errors.DataDependentBranch("model.py:12", cause)
    assert (exc.where, exc.cause) == ("model.py:12", cause) and str(exc).startswith("model.py:12: the model branches")


def test_the_top_level_names_are_few_and_the_old_ones_still_import():
    assert len(onnx_compat.__all__) <= 25 and "OnnxCompatError" in onnx_compat.__all__
    assert "CaptureError" not in onnx_compat.__all__
    from onnx_compat import CaptureError, NotStreamable, QuantizationError, TargetError  # noqa: F401
    assert onnx_compat.CaptureError is errors.CaptureError


@pytest.mark.parametrize("old", ["onnx_compat.export", "onnx_compat.verify", "onnx_compat.diagnose"])
def test_an_old_path_never_shadows_a_public_function(old):
    """``import onnx_compat.verify`` (an old module path) used to make ``onnx_compat.verify`` a module."""
    code = (f"import warnings; warnings.simplefilter('ignore'); import {old}; import onnx_compat; "
            f"f = onnx_compat.{old.rsplit('.', 1)[1]}; print(callable(f), type(f).__name__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["True", "function"], result.stdout + result.stderr


def test_every_old_path_still_imports_and_shadows_nothing():
    from onnx_compat._moved import MOVED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old, new in MOVED.items():
            assert importlib.import_module(old) is importlib.import_module(new)
    for name in onnx_compat.__all__:
        assert not isinstance(getattr(onnx_compat, name), type(onnx_compat)), name
    assert callable(onnx_compat.verify) and callable(onnx_compat.export) and callable(onnx_compat.diagnose)


def test_no_layer_hides_its_imports_behind_a_deps_shim():
    """Four ``_deps.py`` files each claimed to be a package's only door to the internals while others bypassed
    them; a layer imports what it uses from where it is defined."""
    import pathlib
    package = pathlib.Path(onnx_compat.__file__).parent
    assert sorted(str(p.relative_to(package)) for p in package.rglob("_deps.py")) == []


class _InterruptedWhileTraced(nn.Module):
    """Eager calls run; the second call on (a trace) is interrupted, the way an exporter that catches every
    exception wraps Ctrl-C in its own error."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(4, 3), 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("the exporter's own error") from exc
        return self.lin(x)


def test_an_interrupt_during_auto_is_never_an_export_failure(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _export(tmp_path, model=_InterruptedWhileTraced(), exporter="auto")
    assert list(tmp_path.iterdir()) == []


class _StepInterruptedWhileTraced(nn.Module):
    """A streaming step whose trace is interrupted, Ctrl-C wrapped in the exporter's own error."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def step(self, x, h):
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("the exporter's own error") from exc
        y = self.lin(x) + h
        return y, y[:, -1:]


def test_an_interrupt_during_a_streaming_export_is_never_no_exporter(tmp_path):
    """Once an interrupt during a streaming export came out as "no exporter produced a graph" (exit 1)."""
    from onnx_compat import StateSpec
    batch = Dim("batch")
    with pytest.raises(KeyboardInterrupt):
        onnx_compat.export_streaming(_StepInterruptedWhileTraced().step, str(tmp_path / "s.onnx"),
                                     [TensorSpec("data", [batch, 3, 4])], [StateSpec("h", [batch, 1, 4])],
                                     [TensorSpec("output", [batch, 3, 4])], exporter="auto")
    assert list(tmp_path.iterdir()) == []


def test_interrupted_finds_ctrl_c_in_the_cause_chain():
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ValueError("wrapped") from exc
    except ValueError as wrapped:
        assert errors.interrupted(wrapped)
    assert not errors.interrupted(ValueError("plain"))

