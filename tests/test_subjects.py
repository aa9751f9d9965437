"""What ``export()`` is handed besides a plain Python module: a ScriptModule (``torch.jit.script``,
``torch.jit.trace``, ``torch.jit.load``), exported as it is by the TorchScript exporter and verified like any
model, with one clear refusal where an exporter cannot capture it."""
import os

import onnx
import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ArgumentError, ExportError, SpecError

from helpers import EXPORTERS, assert_matches, needs_dynamo

B, T = Dim("batch"), Dim("time")


class GatedRecurrence(nn.Module):
    """What a shipped streaming model scripts (silero-vad): a conv front, a branch on a size, a loop, an LSTM
    fed its state, the new state returned."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x, state):
        h = self.conv(x).transpose(1, 2)
        if x.size(2) > 4:
            h = torch.relu(h) * 2.0
        acc = torch.zeros_like(h)
        for i in range(3):
            acc = acc + h / (i + 1)
        out, (hn, cn) = self.rnn(acc, (state[0], state[1]))
        return out.mean(1), torch.stack([hn, cn])


INPUTS = [TensorSpec("x", [B, 4, T]), TensorSpec("state", [2, 1, B, 8])]
OUTPUTS = [TensorSpec("y", [B, 8]), TensorSpec("state_out", [2, 1, B, 8])]


def _recurrence():
    torch.manual_seed(0)
    return GatedRecurrence().eval()


def _scripted():
    return torch.jit.script(_recurrence())


def _traced():
    return torch.jit.trace(_recurrence(), (torch.randn(3, 4, 10), torch.randn(2, 1, 3, 8)))


def _new_sizes():
    """Sizes the export example (B=3, T=37) never had, B=1 among them, the branch taken both ways (T <= 4)."""
    torch.manual_seed(1)
    return [(torch.randn(b, 4, t), torch.randn(2, 1, b, 8)) for b, t in ((1, 3), (1, 29), (5, 11))]


@pytest.mark.parametrize("make", [_scripted, _traced], ids=["script", "trace"])
def test_a_script_module_is_exported_as_it_is_and_verified(make, tmp_path):
    model = make()
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(model, str(path), INPUTS, OUTPUTS)  # auto
    assert report.exporter == "torchscript" and all(c["ok"] for c in report.verification)
    assert [a.exporter for a in report.attempts] == ["torchscript"]  # dynamo left out: it cannot read TorchScript
    proto = onnx.load(str(path))
    for x, state in _new_sizes():
        assert_matches(proto, model, x, state)
    if make is _scripted:  # compiled, the branch on the size stays a branch (traced, it was recorded once)
        assert "If" in {n.op_type for n in proto.graph.node}


def test_the_script_modules_state_is_as_it_was(tmp_path):
    model = _scripted()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    onnx_compat.export(model, str(tmp_path / "m.onnx"), INPUTS, OUTPUTS)
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@needs_dynamo
def test_dynamo_on_a_script_module_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(ArgumentError, match=r"ScriptModule \(torch.jit.script or torch.jit.load\).*dynamo.*"
                                             r"use exporter='torchscript' or 'auto'"):
        onnx_compat.export(_scripted(), str(path), INPUTS, OUTPUTS, exporter="dynamo")
    assert not os.listdir(tmp_path)


@needs_dynamo
def test_vanilla_dynamo_fails_on_a_script_module():
    """The recorded failure the refusal above replaces (torch 2.13)."""
    model = _scripted()
    with pytest.raises(Exception, match="Exporting a ScriptModule is not supported"):  # noqa: PT011 - torch's own
        torch.onnx.export(model, (torch.randn(3, 4, 10), torch.randn(2, 1, 3, 8)), dynamo=True)


def test_a_failed_script_module_export_says_dynamo_was_left_out(tmp_path):
    class Solve(nn.Module):
        def forward(self, a, b):
            return torch.linalg.solve(a, b)
    path = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"dynamo not tried: the model is a ScriptModule.*aten::linalg_solve"):
        onnx_compat.export(torch.jit.script(Solve()), str(path), [TensorSpec("a", [B, 3, 3]), TensorSpec("b", [B, 3, 2])],
                           [TensorSpec("y", [B, 3, 2])])
    assert not os.listdir(tmp_path)


class CallsScripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Linear(4, 4)
        self.inner = _scripted()

    def forward(self, x, state):
        return self.inner(self.front(x.transpose(1, 2)).transpose(1, 2), state)


def test_a_script_module_called_from_python_is_one_clear_error_naming_it(tmp_path):
    """Neither exporter can capture it there: torch's TorchScript tracing says the ScriptModule "is not part of
    the active trace" (asserted), torch.export cannot read it."""
    model = CallsScripted().eval()
    args = (torch.randn(3, 4, 10), torch.randn(2, 1, 3, 8))
    with pytest.raises(RuntimeError, match="not part of the active trace"):
        torch.onnx.export(model, args, str(tmp_path / "vanilla.onnx"), dynamo=False)
    os.remove(tmp_path / "vanilla.onnx") if (tmp_path / "vanilla.onnx").exists() else None
    with pytest.raises(ArgumentError, match=r"submodule 'inner' is a ScriptModule.*export that ScriptModule itself"):
        onnx_compat.export(model, str(tmp_path / "m.onnx"), INPUTS, OUTPUTS)
    assert not os.listdir(tmp_path)


def test_script_module_inputs_named_out_of_order_are_refused():
    specs = [TensorSpec("state", [2, 1, B, 8], arg="state"), TensorSpec("x", [B, 4, T], arg="x")]
    with pytest.raises(SpecError, match=r"forward's arguments in their order \['x', 'state'\]"):
        onnx_compat.export(_scripted(), "unused.onnx", specs, OUTPUTS)


# ---------------------------------------------------------------- functions and modules wrapped by torch.compile

class CompileCounter:
    """A ``torch.compile`` backend that counts the graphs dynamo hands it and runs them as they are (no
    inductor, no C compiler): the numbers are eager's, the count says whether anything was compiled."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _compiled_on_first_call(backend):
    """What libraries do to keep ``torch.compile``'s start-up off import (moshi's ``torch_compile_lazy``)."""
    def decorate(fun):
        compiled = None

        def wrapped(*args):
            nonlocal compiled
            if compiled is None:
                compiled = torch.compile(fun, backend=backend)
            return compiled(*args)
        return wrapped
    return decorate


def _compiled_model(backend):
    """A compiled function, a method compiled lazily on first call, and an ``OptimizedModule`` submodule."""
    gate = torch.compile(lambda x, a: torch.tanh(x) * torch.sigmoid(a * x), backend=backend)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        @_compiled_on_first_call(backend)
        def forward(self, x):
            return x + self.conv(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 4, 3, padding=1)
            self.blocks = nn.Sequential(Block(), Block())
            self.head = torch.compile(nn.Conv1d(4, 2, 1), backend=backend)
            self.a = nn.Parameter(torch.tensor(1.5))

        def forward(self, x):
            return self.head(self.blocks(gate(self.conv(x), self.a)))

    torch.manual_seed(0)
    return Net().eval()


WAVE_IN, WAVE_OUT = [TensorSpec("x", [B, 2, T])], [TensorSpec("y", [B, 2, T])]


def test_vanilla_torchscript_refuses_a_compiled_function():
    from helpers import export
    model = _compiled_model(CompileCounter())
    with pytest.raises(RuntimeError, match="using FX to torch.jit.trace a dynamo-optimized function"):
        export(model, (torch.randn(3, 2, 37),), "torchscript", {0: {0: "batch", 2: "time"}})


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_compiled_functions_and_modules_export_as_their_python(exporter, tmp_path):
    counter = CompileCounter()
    model = _compiled_model(counter)
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(model, str(path), WAVE_IN, WAVE_OUT, exporter=exporter)
    assert "compiled_as_python" in report.attempts[-1].acted
    assert counter.graphs == 0  # neither the exporter nor the eager reference compiled anything
    torch.manual_seed(2)
    assert_matches(onnx.load(str(path)), model, torch.randn(1, 2, 5))  # the model as users call it: compiled
    assert_matches(onnx.load(str(path)), model, torch.randn(4, 2, 61))
    assert counter.graphs > 0


def test_compiled_functions_stay_compiled_in_eager_code_inside_patched():
    counter = CompileCounter()
    model = _compiled_model(counter)
    with onnx_compat.patched(), torch.no_grad():
        model(torch.randn(2, 2, 9))
    assert counter.graphs > 0


# ---------------------------------------------------------------- models whose outputs are random: tests/test_random_draws.py


_LAZY_MODEL = """
def helper(x):
    if int(x.shape[-1]) < 0:  # a branch the export never takes, naming what the model never loads
        return utils.missing_in_export_only(x)
    return utils.scale(x)


class UsesLazyUtils(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return helper(self.lin(x))
"""


def test_a_model_whose_helpers_module_loads_lazily_exports_without_importing_it(tmp_path):
    """A model's code that names a lazily loading module (lazy_loader, a module ``__getattr__``, as funasr's
    utils are): reading the model's functions for the int() redirection must not import what the model never
    uses (funasr's CT-Transformer failed patched with 'No module named samplerate', and exported plainly)."""
    import types
    lazy = types.ModuleType("lazily_loaded_utils")

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r} (an optional dependency)")
    lazy.__getattr__ = missing
    lazy.scale = lambda x: 2 * x
    namespace = {"utils": lazy, "torch": torch, "nn": nn, "__name__": "user_model_code"}
    exec(_LAZY_MODEL, namespace)
    model = namespace["UsesLazyUtils"]().eval()
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("x", [B, T, 4])],
                                [TensorSpec("y", [B, T, 4])], exporter="torchscript")
    assert report.strategy == "torchscript" and all(c["ok"] for c in report.verification), report.why
