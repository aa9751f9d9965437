"""The export pipeline: both exporters and auto, verification, safety, clear errors."""
import json
import math
import os

import onnx
import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, ExportError, SpecError, TensorSpec, check_rasr
from onnx_compat.pipeline import capture

from onnx_compat.models import conv_demo

from helpers import EXPORTERS, PAD_FUSION, needs_dynamo
from models import NamedArgs, Subsample, mask_of, named_specs, subsample_specs


@pytest.fixture(scope="module")
def demo():
    return conv_demo.build()


@pytest.mark.parametrize("exporter", EXPORTERS + ["auto"])
def test_classic_demo_exports_verifies_and_passes_rasr(demo, exporter, tmp_path):
    path = tmp_path / "demo.onnx"
    report = onnx_compat.export(demo["model"], str(path), demo["inputs"], demo["outputs"], exporter=exporter, rasr=True)
    assert report.exporter == ("torchscript" if exporter == "auto" else exporter)  # auto: TorchScript first
    assert path.exists() and report.auto_pad == []
    names = [(v["name"], v["dtype"], v["dims"]) for v in report.inputs + report.outputs]
    assert names == [("data", "float", ["batch", "time", 40]), ("data:size1", "int32", ["batch"]),
                     ("output", "float", ["batch", "time", 32]), ("output:size1", "int32", ["batch"])]
    checked = [c["sizes"] for c in report.verification]
    assert {"batch": 1} .items() <= checked[0].items() and len(checked) >= 3
    assert all(c["ok"] for c in report.verification) and report.degenerate == []
    assert 0 < report.max_abs_err < 1e-4
    assert report.rasr["ok"] and "feature-scorer" in report.rasr["roles"]
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["onnx_compat.exporter"] == report.exporter
    assert json.loads(meta["onnx_compat.inputs"])[0]["lengths"] == {"data:size1": "int32"}
    assert json.loads(report.to_json())["exporter"] == report.exporter


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_real_output_lengths_from_a_subsampling_model(exporter, tmp_path):
    torch.manual_seed(0)
    inputs, outputs = subsample_specs()
    path = str(tmp_path / "sub.onnx")
    report = onnx_compat.export(Subsample().eval(), path, inputs, outputs, exporter=exporter)
    out_dims = report.outputs[0]["dims"]
    assert out_dims[0] == "batch" and isinstance(out_dims[1], str) and out_dims[1] != "time"
    rasr = check_rasr(path)
    assert rasr.ok and rasr.roles() == ["encoder"]   # T' != T: not a feature scorer


def test_named_forward_arguments_and_int64_lengths(tmp_path):
    inputs, outputs = named_specs(torch.int64)
    model = NamedArgs().train()                       # dropout must be off during export
    report = onnx_compat.export(model, str(tmp_path / "n.onnx"), inputs, outputs, exporter="torchscript")
    assert [v["dtype"] for v in report.inputs] == ["float", "int64"]
    assert model.training and model.drop.training     # restored
    rasr = check_rasr(str(tmp_path / "n.onnx"))
    assert any("int32" in f for f in rasr.findings)   # RASR wants int32 lengths


class NoLengthsBack(nn.Module):
    def forward(self, data, lengths):
        return data * mask_of(data, lengths)[..., None]


def _io(out_dims=None, out_dtype=torch.float32, out_lengths=(1,)):
    batch, time = Dim("batch"), Dim("time")
    return ([TensorSpec("data", [batch, time, 3], lengths=[1])],
            [TensorSpec("output", out_dims or [batch, time, 3], dtype=out_dtype, lengths=out_lengths)])


@pytest.mark.parametrize("case, error, match", [
    ("not a module", TypeError, "nn.Module"),
    ("exporter", ValueError, "unknown exporter 'onnx2'"),
    ("forward arg", ValueError, "'speech'"),
    ("lengths not returned", SpecError, "returned 1 tensor.*output:size1"),
    ("rank", SpecError, "output 'output': declared rank 2"),
    ("static size", SpecError, "output 'output' dim 2: declared static size 7, the model returned 3"),
    ("dtype", SpecError, "output 'output': declared dtype torch.float16"),
    ("path", ValueError, "does not exist"),
])
def test_bad_input_gets_one_clear_error_and_nothing_is_written(case, error, match, tmp_path):
    model, (inputs, outputs) = NoLengthsBack(), _io(out_lengths=())
    path = tmp_path / "m.onnx"
    kwargs = {"exporter": "torchscript"}
    if case == "not a module":
        model = lambda data, lengths: data  # noqa: E731
    elif case == "exporter":
        kwargs["exporter"] = "onnx2"
    elif case == "forward arg":
        inputs = [TensorSpec("data", [Dim("batch"), Dim("time"), 3], lengths=[1], arg="speech", length_args={1: "lengths"})]
    elif case == "lengths not returned":
        outputs = _io()[1]
    elif case == "rank":
        outputs = _io(out_dims=[Dim("batch"), Dim("time")], out_lengths=())[1]
    elif case == "static size":
        outputs = _io(out_dims=[Dim("batch"), Dim("time"), 7], out_lengths=())[1]
    elif case == "dtype":
        outputs = _io(out_dtype=torch.float16, out_lengths=())[1]
    elif case == "path":
        path = tmp_path / "missing" / "m.onnx"
    with pytest.raises(error, match=match):
        onnx_compat.export(model, str(path), inputs, outputs, **kwargs)
    assert os.listdir(tmp_path) == []


def test_unspecified_output_dims_come_from_the_model(tmp_path):
    inputs, outputs = _io(out_dims=[Dim("batch"), Dim("time"), None], out_lengths=())
    report = onnx_compat.export(NoLengthsBack(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript")
    assert report.outputs[0]["dims"] == ["batch", "time", 3]


class Cheater(nn.Module):
    """Differs while exporting: verification must catch it with either exporter."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, data, lengths):
        y = self.lin(data)
        if torch.onnx.is_in_onnx_export():
            y = y + 1.0
        return y * mask_of(data, lengths)[..., None]


def test_failed_verification_leaves_no_file_and_the_model_as_it_was(tmp_path):
    model = Cheater().train()
    model.lin.eval()                                  # mixed flags, as a user might have
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "cheat.onnx"
    with pytest.raises(ExportError) as info:
        onnx_compat.export(model, str(path), *_io(out_lengths=()), exporter="auto")
    assert "max abs err" in str(info.value)
    for exporter in EXPORTERS:
        assert f"{exporter}:" in str(info.value)
    assert os.listdir(tmp_path) == []
    assert model.training and not model.lin.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_torchscript_export_keeps_every_training_flag_and_parameter(tmp_path):
    torch.manual_seed(0)
    model = conv_demo.ConvDemo(features=6, hidden=8, classes=4).train()
    model.convs[1].eval()
    flags = [m.training for m in model.modules()]
    params = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    inputs, outputs = conv_demo.io_specs(6, 4)
    onnx_compat.export(model, str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript")
    assert [m.training for m in model.modules()] == flags
    assert all(p is params[n][0] and torch.equal(p, params[n][1]) for n, p in model.named_parameters())
    # the vanilla exporter does not do this: it ends with model.train(root_flag)
    with onnx_compat.patched(only=["conv_padding"]):  # torch 2.0 cannot export string padding without it
        torch.onnx.export(model, (torch.randn(2, 9, 6), torch.tensor([9, 5])), str(tmp_path / "v.onnx"),
                          **capture._TORCHSCRIPT)
    assert [m.training for m in model.modules()] != flags


class Baked(nn.Module):
    def forward(self, data, lengths):
        # a baked constant, harmless here (F is static); float() of a traced size is kept in the graph, a math
        # function's argument is not
        scale = 1.0 / math.sqrt(data.shape[-1])
        return data * scale * mask_of(data, lengths)[..., None]


def test_baked_constants_are_reported_and_strict_refuses_them(tmp_path):
    inputs, outputs = _io(out_lengths=())
    report = onnx_compat.export(Baked(), str(tmp_path / "b.onnx"), inputs, outputs, exporter="torchscript")
    assert report.warnings["baked"] and "Python float" in report.warnings["baked"][0]
    with pytest.raises(ExportError, match="strict"):
        onnx_compat.export(Baked(), str(tmp_path / "s.onnx"), inputs, outputs, exporter="torchscript", strict=True)
    assert not (tmp_path / "s.onnx").exists()


class DataDependent(nn.Module):
    def forward(self, data, lengths):
        if bool(lengths.max() > 0):               # dynamo cannot guard on this; TorchScript bakes it
            data = data * 2
        return data * mask_of(data, lengths)[..., None]


class FrozenShape(nn.Module):
    def forward(self, data, lengths):
        zeros = torch.zeros(data.data.shape)      # .data leaves the trace: TorchScript freezes the shape
        return (data + zeros + 1) * mask_of(data, lengths)[..., None]


# without the patch that traces .data, FrozenShape is a model TorchScript gets wrong and dynamo right
WITHOUT_DATA = {"exclude": ["data_as_detach"]}


@needs_dynamo
def test_auto_falls_back_to_dynamo_and_says_why(tmp_path):
    report = onnx_compat.export(FrozenShape(), str(tmp_path / "d.onnx"), *_io(out_lengths=()), exporter="auto",
                                patches=WITHOUT_DATA)
    assert report.exporter == "dynamo" and report.why == "fallback: torchscript did not export or verify"
    failed = [a for a in report.attempts if not a.ok]
    assert [a.exporter for a in failed] == ["torchscript"] and "'batch'" in failed[0].error, failed
    assert all(c["ok"] for c in report.verification)


def test_auto_takes_torchscript_where_dynamo_cannot_guard(tmp_path):
    """auto starts with TorchScript: a branch on a value (dynamo cannot guard on it) costs no dynamo attempt."""
    report = onnx_compat.export(DataDependent(), str(tmp_path / "d.onnx"), *_io(out_lengths=()), exporter="auto")
    assert report.exporter == "torchscript" and [a.exporter for a in report.attempts] == ["torchscript"]
    assert report.why == ("torchscript exported and verified" if "dynamo" in EXPORTERS else report.why)


class BakesTime(nn.Module):
    def forward(self, data):
        return data.reshape(data.shape[0], 37 * 3).reshape(data.shape[0], 37, 3) * 2


@needs_dynamo
def test_a_dynamic_dim_that_comes_back_static_is_an_error(tmp_path):
    batch, time = Dim("batch"), Dim("time")
    inputs = [TensorSpec("data", [batch, time, 3])]
    outputs = [TensorSpec("output", [batch, time, 3])]
    # torch.export names the input (2.13, 2.15); torch 2.8 exports a static graph, whose output the dims check names
    with pytest.raises(ExportError, match=r"'(data|output)' dim 1 \('time'\) was requested dynamic but is 37"):
        onnx_compat.export(BakesTime(), str(tmp_path / "x.onnx"), inputs, outputs, exporter="dynamo")


def test_user_metadata_is_kept(demo, tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx_compat.export(demo["model"], path, demo["inputs"], demo["outputs"], exporter="torchscript",
                       metadata={"model_type": "conv_demo", "vocab_size": "32"})
    meta = onnx_compat.describe(path)["metadata"]
    assert meta["model_type"] == "conv_demo" and meta["vocab_size"] == "32" and "torch.version" in meta


@pytest.mark.filterwarnings("ignore:my_layer:DeprecationWarning")  # the eager forwards raise it too
def test_a_users_own_deprecation_warning_is_kept_torchs_are_dropped(tmp_path):
    import warnings

    class Deprecating(Subsample):
        def forward(self, data, lengths):
            warnings.warn("my_layer() is deprecated, use my_new_layer()", DeprecationWarning)
            return super().forward(data, lengths)

    torch.manual_seed(0)
    inputs, outputs = subsample_specs()
    report = onnx_compat.export(Deprecating().eval(), str(tmp_path / "m.onnx"), inputs, outputs,
                                exporter="torchscript")
    kept = report.warnings["other"]
    assert any("my_layer() is deprecated" in w for w in kept)
    assert not any("/torch/" in w and "Deprecat" in w for w in kept)


@needs_dynamo
@pytest.mark.filterwarnings("ignore:a note from the model")
def test_a_failed_attempt_keeps_its_own_warnings(tmp_path):
    import warnings

    class Noting(FrozenShape):
        def forward(self, *args):
            warnings.warn("a note from the model", UserWarning)
            return super().forward(*args)

    report = onnx_compat.export(Noting(), str(tmp_path / "d.onnx"), *_io(out_lengths=()), exporter="auto",
                                patches=WITHOUT_DATA)
    failed = [a for a in report.attempts if not a.ok]
    assert failed and any("a note from the model" in w for w in failed[0].warnings["other"])
    assert any("a note from the model" in w for w in report.warnings["other"])  # the used attempt's own
    assert "a note from the model" in json.dumps(report.to_dict())


class Reassigns(nn.Module):
    """Assigns module state in forward, as transformers' CLAP audio layers do (window_size)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.window = 4
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, data):
        self.window = min(data.shape[1], 4)  # a Tensor while the TorchScript exporter traces
        self.last = data.shape[0]            # an attribute that was not there
        self.calls += 1                      # a buffer changed in place
        return self.lin(data) * self.window


@pytest.mark.parametrize("exporters", [("torchscript", "dynamo"), ("dynamo", "torchscript")], ids="-then-".join)
def test_an_export_that_assigns_module_state_leaves_the_model_as_it_was(exporters, tmp_path):
    model = Reassigns().train()
    calls, buffer = model.calls, model.calls.clone()
    batch, time = Dim("batch"), Dim("time", min=5)
    for i, exporter in enumerate(e for e in exporters if e in EXPORTERS):
        onnx_compat.export(model, str(tmp_path / f"{i}.onnx"), [TensorSpec("data", [batch, time, 3])],
                           [TensorSpec("output", [batch, time, 3])], exporter=exporter)
        assert type(model.window) is int and model.window == 4
        assert not hasattr(model, "last") and model.training
        assert model.calls is calls and torch.equal(model.calls, buffer)


class LenPooling(nn.Module):
    """ECAPA-TDNN's attentive pooling mask (speechbrain; transformers' Qwen2.5-Omni): the batch
    size reaches the mask through ``len()`` of a tensor built from ``x.shape[0]``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, data):
        x = data.transpose(1, 2)  # [B, C, L]
        L = x.shape[-1]
        lengths = torch.ones(x.shape[0], device=x.device)
        mask = torch.arange(L, device=x.device).expand(len(lengths), L) < (lengths * L).unsqueeze(1)
        weights = torch.softmax(self.proj(data).masked_fill(~mask[..., None], float("-inf")), dim=1)
        return (weights * data).sum(1)


@needs_dynamo
def test_len_of_a_batch_sized_tensor_keeps_the_batch_dynamic(tmp_path):
    """Named torch.export Dims made this batch static (an error, then TorchScript baked B);
    dynamic hints keep it symbolic, and the graph verifies at B=1 and B=5. TorchScript keeps len() of a
    tensor as the traced batch since issue #47 (padded_lengths_int); without that patch it bakes B."""
    inputs = [TensorSpec("data", [Dim("batch"), Dim("time"), 6])]
    outputs = [TensorSpec("output", [Dim("batch"), 6])]
    path, model = str(tmp_path / "pool.onnx"), LenPooling().eval()
    report = onnx_compat.export(model, path, inputs, outputs, exporter="dynamo")
    assert report.exporter == "dynamo" and [(a.exporter, a.ok) for a in report.attempts] == [("dynamo", True)]
    checks = onnx_compat.verify(path, model, inputs, outputs,
                                sizes=[{"batch": 1, "time": 9}, {"batch": 5, "time": 41}])
    assert all(c.ok for c in checks)
    report = onnx_compat.export(model, str(tmp_path / "ts.onnx"), inputs, outputs, exporter="torchscript")
    assert all(c["ok"] for c in report.verification) and report.verification[0]["sizes"]["batch"] == 1
    with pytest.raises(ExportError, match=r"has shape \[3, 6\] in ONNX but \[1, 6\].*frozen into the graph by Python code at .*test_export.py:\d+"):
        onnx_compat.export(model, str(tmp_path / "ts.onnx"), inputs, outputs, exporter="torchscript",
                           patches={"exclude": ["padded_lengths_int"]})


@needs_dynamo
def test_opset_is_a_promise(tmp_path):
    """torch's dynamo exporter writes opset 18 when asked for 17 and its conversion fails (a LayerNorm block; the
    bundled Conformer too), with a log line only: asked of dynamo, that is an error; auto (TorchScript first)
    writes 17."""
    import onnx

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(self.norm(x)).mean(-1, keepdim=True) * x

    inputs, outputs = [TensorSpec("x", [Dim("b"), Dim("t"), 8])], [TensorSpec("y", [Dim("b"), Dim("t"), 8])]
    path = str(tmp_path / "c.onnx")
    report = onnx_compat.export(Block(), path, inputs, outputs, exporter="auto", opset=17)
    assert [a.exporter for a in report.attempts] == ["torchscript"] and report.attempts[0].error is None
    written = onnx.load(path)
    assert report.opset["ai.onnx"] == 17 and report.ir_version == written.ir_version == 8
    assert [i.version for i in written.opset_import if i.domain in ("", "ai.onnx")] == [17]
    # torch 2.13 writes 18 anyway and says so in a log line only; 2.8 fails to translate a size op at 17
    with pytest.raises(ExportError, match="dynamo wrote opset 18, not the requested opset 17|No ONNX function found"):
        onnx_compat.export(Block(), str(tmp_path / "d.onnx"), inputs, outputs, exporter="dynamo", opset=17)
    assert not (tmp_path / "d.onnx").exists()


def test_the_torchscript_pipeline_runs_and_cleans_without_onnxscript(tmp_path, monkeypatch):
    """Old torch releases install without onnxscript; cleanup is ONNX Runtime's own optimiser, so nothing is lost."""
    import sys
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript raises ImportError
    from onnx_compat.models import conv_demo
    job = conv_demo.build_hard()
    report = onnx_compat.export(job["model"], str(tmp_path / "m.onnx"), job["inputs"], job["outputs"],
                                exporter="torchscript")
    assert report.nodes < report.nodes_before_cleanup and ("Pad" not in report.ops or not PAD_FUSION)
    assert all(c["ok"] for c in report.verification)


def test_a_torch_older_than_2_is_one_clear_import_error():
    import subprocess
    import sys
    code = ("import sys, types; t = types.ModuleType('torch'); t.__version__ = '1.13.1'; sys.modules['torch'] = t\n"
            "import onnx_compat")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == ("ImportError: onnx_compat needs torch >= 2.0; this is torch "
                                                    "1.13.1 (pip install 'torch>=2.0')")


class CachedPositions(nn.Module):
    """A length-keyed cache on the module (rotary-embedding libraries keep one): after one eager call at
    T, a trace at a length <= T takes the cached branch and bakes T into the graph."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.cached, self.cached_len = None, 0

    def forward(self, x):
        t = x.shape[1]
        if self.cached is not None and t <= self.cached_len:
            pos = self.cached[:t]
        else:
            pos = torch.arange(t, dtype=x.dtype)
            self.cached, self.cached_len = pos, t
        return self.proj(x) + pos[None, :, None]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_cache_left_by_an_eager_call_does_not_reach_the_trace(exporter, tmp_path):
    """The pipeline runs the model once before exporting (the output check): that call's cache must not
    make the trace take the cached branch."""
    torch.manual_seed(0)
    model = CachedPositions()
    b, t = Dim("batch"), Dim("time")
    report = onnx_compat.export(model, str(tmp_path / "m.onnx"), [TensorSpec("data", [b, t, 4])],
                                [TensorSpec("output", [b, t, 4])], exporter=exporter)
    assert all(c["ok"] for c in report.verification), report.summary()
    assert model.cached is None and model.cached_len == 0  # the user's model as it was


class UnitVocoderHead(nn.Module):
    """Unit ids and a speaker id index embeddings of 5 and 2 rows: integers drawn in [0, 10) would fail."""

    def __init__(self):
        super().__init__()
        self.units, self.speakers = nn.Embedding(5, 4), nn.Embedding(2, 4)

    def forward(self, units, speaker):
        return self.units(units) + self.speakers(speaker)[:, None, :]


def test_integer_inputs_take_the_range_of_the_table_they_index(tmp_path):
    torch.manual_seed(0)
    b, t = Dim("batch"), Dim("time")
    inputs = [TensorSpec("units", [b, t], dtype=torch.int64), TensorSpec("speaker", [b], dtype=torch.int64)]
    report = onnx_compat.export(UnitVocoderHead(), str(tmp_path / "m.onnx"), inputs,
                                [TensorSpec("output", [b, t, 4])], exporter="torchscript")
    assert all(c["ok"] for c in report.verification), report.summary()
    notes = " ".join(report.findings)
    assert "units: values=(0, 5)" in notes and "speaker: values=(0, 2)" in notes, report.findings


class ShiftedIds(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(3, 4)

    def forward(self, ids):
        return self.table(ids + 1)


def test_an_integer_range_that_cannot_be_read_is_one_error_naming_the_input(tmp_path):
    b, t = Dim("batch"), Dim("time")
    with pytest.raises(SpecError, match=r"'ids'.*values="):
        onnx_compat.export(ShiftedIds(), str(tmp_path / "m.onnx"), [TensorSpec("ids", [b, t], dtype=torch.int64)],
                           [TensorSpec("output", [b, t, 4])], exporter="torchscript")
    assert not (tmp_path / "m.onnx").exists()


class _InPlace(nn.Module):
    """Writes into its own input: every eager call must get its own copy of what it is fed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 6)

    def forward(self, x):
        x *= 2.0
        return self.lin(x)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_model_that_writes_into_its_input_exports_and_verifies(exporter, tmp_path):
    """The eager reference and the graph are fed the same values at every checked size; the user's example
    comes back unchanged, and verify() alone agrees."""
    model = _InPlace().eval()
    inputs = [TensorSpec("x", [Dim("batch"), Dim("time"), 8])]
    outputs = [TensorSpec("y", [Dim("batch"), Dim("time"), 6])]
    example = torch.randn(2, 11, 8)
    kept = example.clone()
    path = str(tmp_path / "inplace.onnx")
    report = onnx_compat.export(model, path, inputs, outputs, exporter=exporter, examples=[{"x": example}])
    assert torch.equal(example, kept), "the user's example was written into"
    assert report.verified_elsewhere() >= 2 and report.max_abs_err < 1e-4
    checks = onnx_compat.verify(path, model, inputs, outputs, examples=[{"x": example}])
    assert all(c.ok for c in checks) and torch.equal(example, kept)


class _NoTorchScriptOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.special.airy_ai(x))  # no ONNX symbolic under TorchScript


def test_a_failed_torchscript_attempt_dumps_no_ir_graph(tmp_path, capfd):
    """torch 2.13's setup_onnx_logging tests a function for truth instead of calling it, so its ONNX log is on
    after any TorchScript export in the process (set here as a long session leaves it); a failed attempt then
    prints its whole IR graph ("Torch IR graph at exception"), though the error already says what failed."""
    specs = ([TensorSpec("x", [Dim("batch"), Dim("time"), 4])], [TensorSpec("y", [Dim("batch"), Dim("time"), 4])])
    was = torch._C._jit_is_onnx_log_enabled()
    torch._C._jit_set_onnx_log_enabled(True)
    try:
        with pytest.raises(ExportError, match="airy_ai"):
            onnx_compat.export(_NoTorchScriptOp().eval(), str(tmp_path / "m.onnx"), *specs, exporter="torchscript")
        assert torch._C._jit_is_onnx_log_enabled(), "the log switch was not put back as it was"
    finally:
        torch._C._jit_set_onnx_log_enabled(was)
    printed = capfd.readouterr()
    assert "Torch IR graph at exception" not in printed.out + printed.err


def test_short_timings_read_in_milliseconds():
    """A runtime's median call of 0.4 ms is not '0.00s'."""
    from onnx_compat.pipeline.report import Report
    text = Report(timings={"openvino median call": 0.0004, "export_torchscript": 1.5}).summary()
    assert "openvino median call 0.4 ms" in text and "export_torchscript 1.50s" in text, text


def test_the_eager_model_runs_once_on_the_users_first_example(tmp_path):
    """The first user example is the export example (its outputs checked before capture) and a verification
    case: its eager reference is the outputs the check got, not a second run; every other case runs once."""
    seen = []

    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(6, 5)

        def forward(self, x):
            seen.append((tuple(x.shape), torch.jit.is_tracing()))
            return torch.tanh(self.proj(x)) * x.shape[1]

    inputs = [TensorSpec("x", [Dim("batch"), Dim("time"), 6])]
    outputs = [TensorSpec("y", [Dim("batch"), Dim("time"), 5])]
    first, second = {"x": torch.randn(2, 9, 6)}, {"x": torch.randn(3, 4, 6)}
    report = onnx_compat.export(Counted(), str(tmp_path / "m.onnx"), inputs, outputs, exporter="torchscript",
                                examples=[first, second])
    eager = [shape for shape, tracing in seen if not tracing]
    assert eager.count((2, 9, 6)) == 1 and eager.count((3, 4, 6)) == 1, seen  # check_outputs; the second's reference
    assert len(eager) == 2 + 3, seen  # and the three generated shapes
    checked = [c for c in report.verification if c.get("example")]
    assert len(checked) == 2 and all(c["ok"] for c in checked), report.verification
