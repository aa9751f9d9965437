"""The package's layers, read from its source: the pipeline imports nothing above it, no layer imports back in a
circle, and a deployment step plugs into ``export()`` with no change to ``pipeline/``.

The import graph is built with ``ast`` from every ``.py`` file of ``onnx_compat/``, counting every import
statement wherever it stands (inside functions too: a lazy import is still an arrow).
"""
import ast
import importlib
import json
import os
import subprocess
import sys
from typing import Dict, List, Set

import onnx
import pytest
import torch
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.pipeline.steps import Step, StepError

PACKAGE = os.path.dirname(os.path.abspath(onnx_compat.__file__))
ROOT = os.path.dirname(PACKAGE)
# What the pipeline and the patches must never import: the layers built on them.
ABOVE = ("onnx_compat.quantization", "onnx_compat.contracts", "onnx_compat.diagnosis", "onnx_compat.streaming",
         "onnx_compat.huggingface", "onnx_compat.parts", "onnx_compat.label_scorers", "onnx_compat.deploy",
         "onnx_compat.api", "cli")
BELOW = ("onnx_compat.pipeline", "onnx_compat.patches")


def _modules() -> Dict[str, str]:
    """Every module of the package by dotted name, with its file."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


def _targets(module: str, path: str, node, modules: Dict[str, str]) -> List[str]:
    """The package's modules one import statement names (``from a import b``: ``a.b`` when it is a module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
            parts = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    out = []
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules:
            out.append(name)
    return out


def _typing_only(tree) -> Set[int]:
    """The ids of the import statements under ``if TYPE_CHECKING:``, which never run."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return found


def import_graph(running_only: bool = False) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports, from the source (``running_only``: without the imports under
    ``if TYPE_CHECKING:``)."""
    modules = _modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        skip = _typing_only(tree) if running_only else set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                graph[module].update(t for t in _targets(module, path, node, modules) if t != module)
    return graph


def layer(module: str) -> str:
    """A module's layer: its subpackage or top-level module; every command-line module (``cli.py``, ``command.py``,
    ``verbs/``, each layer's ``cli.py``) is the one layer "cli"."""
    parts = module.split(".")
    if module in ("onnx_compat.cli", "onnx_compat.command") or parts[:2] == ["onnx_compat", "verbs"] \
            or (len(parts) > 2 and parts[-1] == "cli"):
        return "cli"
    return ".".join(parts[:2])


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_lazy_and_relative_imports():
    """The reader finds what it must to be trusted: a function-level import and a relative one."""
    graph = import_graph()
    assert "onnx_compat.diagnosis.of_export" in graph["onnx_compat.api"]  # inside a function
    assert "onnx_compat.contracts.base" in graph["onnx_compat.contracts"]  # ``from .base import ...``
    assert "onnx_compat.pipeline.steps" in graph["onnx_compat.pipeline.request"]


def test_no_arrow_from_the_pipeline_or_the_patches_up():
    arrows = sorted(f"{m} -> {t}" for m, targets in import_graph().items() if m.startswith(BELOW)
                    for t in targets if layer(t) in ABOVE or t in ABOVE or t == "onnx_compat")
    assert arrows == []


def test_no_circle_between_layers():
    edges: Dict[str, Set[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            if layer(module) != layer(target):
                edges.setdefault(layer(module), set()).add(layer(target))
    assert _cycles(edges) == []


def module_cycles() -> List[List[str]]:
    """The package's modules that import each other in a circle. A lazy import inside a function is still an
    arrow; not arrows: an import under ``if TYPE_CHECKING:`` (it never runs), and a package's ``__init__``
    importing a module of its own (it re-exports or dispatches to its parts, which may read what it defines)."""
    modules = _modules()
    packages = {m for m, path in modules.items() if path.endswith("__init__.py")}
    edges = {m: {t for t in targets if not (m in packages and t.startswith(m + "."))}
             for m, targets in import_graph(running_only=True).items()}
    return _cycles(edges)


def test_no_circle_between_modules():
    """No two modules of the package import each other, directly or round a circle (issue #45, 13): the
    sherpa streaming contract's two modules did, then five more circles (int_calls/lengths, the Hugging Face
    job and Whisper, the label scorers' graphs and step, their api and the state-managed kinds, combine and its
    time-synchronous proof); each module of a circle ran while another was half-initialised, and none could be
    read without the others. What both sides needed now lives in a module below them (``checkpoint_folder``,
    ``reports``, ``combine_members``) or is passed as an argument. Old public paths still import."""
    assert module_cycles() == []
    from onnx_compat.huggingface.job import read_model_type
    from onnx_compat.label_scorers.api import CONFIG_FILE, FRAMES_EXAMPLE, REPORT_FILE, LabelScorerReport
    from onnx_compat.label_scorers.state_managed import StateManagedReport
    assert read_model_type is importlib.import_module("onnx_compat.huggingface.checkpoint_folder").read_model_type
    assert issubclass(StateManagedReport, LabelScorerReport)
    assert (CONFIG_FILE, REPORT_FILE, FRAMES_EXAMPLE) == ("label-scorer.config", "report.json", 16)


def test_every_export_entry_point_is_importable_from_the_package():
    """Each ``export...`` function the README and docs/ import (``export``, ``export_streaming``,
    ``export_transducer``, ...) is a public name of ``onnx_compat`` too; ``export_transducer`` was the one that was
    not (issue #45). Read from the pages, so an entry point documented later is found here."""
    import glob
    import re
    pages = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    documented = set()
    for page in pages:
        with open(page, encoding="utf-8") as fh:
            for names in re.findall(r"from onnx_compat[.\w]* import ([\w, ]+)", fh.read()):
                documented.update(n.strip() for n in names.split(",") if n.strip().startswith("export"))
    assert {"export", "export_streaming", "export_transducer", "export_label_scorer"} <= documented, documented
    assert sorted(documented - onnx_compat.PUBLIC) == [], "add to onnx_compat's public names"
    assert onnx_compat.export_transducer is importlib.import_module("onnx_compat.parts.transducer").export_transducer
    assert "export_transducer" in onnx_compat.__all__


def test_a_plain_export_loads_no_feature_above_the_pipeline(tmp_path):
    """What the source says, as Python runs it: an export that asks for no deployment step (and does not fail)
    loads no consumer, quantization, diagnosis, streaming, checkpoint support or CLI."""
    features = tuple(a for a in ABOVE if a not in ("cli", "onnx_compat.deploy", "onnx_compat.api")) + \
        ("onnx_compat.cli", "onnx_compat.command", "onnx_compat.verbs")
    code = ("import json, sys, torch, onnx_compat; from onnx_compat import Dim, TensorSpec; "
            "onnx_compat.export(torch.nn.Linear(6, 4), sys.argv[1], [TensorSpec('x', [Dim('batch'), 6])], "
            "[TensorSpec('y', [Dim('batch'), 4])], exporter='torchscript'); "
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({features!r}))))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.onnx")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert os.path.exists(tmp_path / "m.onnx")


# A deployment step defined here, outside the package: the pipeline is not told about it.

class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def _specs():
    return [TensorSpec("x", [Dim("batch"), Dim("time"), 6])], [TensorSpec("y", [Dim("batch"), Dim("time"), 4])]


class Stamp(Step):
    """Adds a metadata entry before writing and a side file after; says what it did."""

    name = "stamp"

    def __init__(self, fail_before_write: bool = False, refuse_specs: bool = False):
        self.fail_before_write, self.refuse_specs = fail_before_write, refuse_specs
        self.calls: List[str] = []
        self.nodes = None

    def before_capture(self, request):
        self.calls.append("before_capture")
        if self.refuse_specs:
            raise ValueError(f"stamp: {request.subject.inputs[0].name!r} is not what the stamp wants")

    def before_write(self, request, report, proto):
        self.calls.append("before_write")
        assert report.verification and all(c["ok"] for c in report.verification)  # the graph is proven first
        onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, "stamp": "yes"})
        self.nodes = len(proto.graph.node)
        if self.fail_before_write:
            raise ValueError("stamp: the graph is not stampable")

    def write_files(self, request, report, folder):
        self.calls.append("write_files")
        path = os.path.join(folder, "stamp.txt")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"{self.nodes}\n")
        return [path]

    def describe(self):
        return {"nodes": self.nodes, "summary": [f"stamp       {self.nodes} nodes stamped"]}


def test_a_new_step_plugs_into_export_without_a_pipeline_change(tmp_path):
    path = tmp_path / "m.onnx"
    stamp = Stamp()
    report = onnx_compat.export(Scale(), str(path), *_specs(), exporter="torchscript", steps=[stamp])
    assert stamp.calls == ["before_capture", "before_write", "write_files"]
    written = onnx.load(str(path))
    assert {p.key: p.value for p in written.metadata_props}["stamp"] == "yes"
    assert report.metadata["stamp"] == "yes"  # the report describes the graph as the step left it
    assert (tmp_path / "stamp.txt").read_text() == f"{len(written.graph.node)}\n"
    assert report.files == [str(tmp_path / "stamp.txt")] and "beside      stamp.txt" in report.summary()
    assert report.steps == {"stamp": {"nodes": len(written.graph.node),
                                      "summary": [f"stamp       {len(written.graph.node)} nodes stamped"]}}
    assert "stamp       " in report.summary() and json.loads(report.to_json())["steps"]["stamp"]["nodes"]
    assert report.rasr is None and report.contract is None and report.quantization is None


def test_a_step_that_fails_before_writing_leaves_no_file(tmp_path):
    model = Scale()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stamp = Stamp(fail_before_write=True)
    with pytest.raises(ValueError, match="not stampable"):
        onnx_compat.export(model, str(tmp_path / "m.onnx"), *_specs(), exporter="torchscript", steps=[stamp])
    assert stamp.calls == ["before_capture", "before_write"]
    assert os.listdir(tmp_path) == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_step_refuses_before_anything_is_exported(tmp_path, monkeypatch):
    from onnx_compat.pipeline import capture
    ran = []
    monkeypatch.setattr(capture, "run", lambda *a, **k: ran.append(1))
    with pytest.raises(ValueError, match="not what the stamp wants"):
        onnx_compat.export(Scale(), str(tmp_path / "m.onnx"), *_specs(), steps=[Stamp(refuse_specs=True)])
    assert ran == [] and os.listdir(tmp_path) == []


def test_steps_that_cannot_run_together_are_refused(tmp_path):
    class Writer(Step):
        writes_model = True

        def __init__(self, name):
            self.name = name

    with pytest.raises(StepError, match="two steps named 'stamp'"):
        onnx_compat.export(Scale(), str(tmp_path / "m.onnx"), *_specs(), steps=[Stamp(), Stamp()])
    with pytest.raises(StepError, match=r"\['a', 'b'\] each write the model"):
        onnx_compat.export(Scale(), str(tmp_path / "m.onnx"), *_specs(), steps=[Writer("a"), Writer("b")])
    with pytest.raises(StepError, match="expected onnx_compat.pipeline.steps.Step"):
        onnx_compat.export(Scale(), str(tmp_path / "m.onnx"), *_specs(), steps=[object()])
    assert os.listdir(tmp_path) == []


def test_rasr_true_and_the_rasr_contract_are_one_step():
    from onnx_compat.deploy import steps_for
    for spelling in ({"rasr": True}, {"contract": "rasr"}, {"rasr": True, "contract": "rasr"}):
        assert [s.name for s in steps_for(**spelling)] == ["rasr"], spelling
    named = steps_for(rasr={"features": "x", "features_size": None, "output": "y"}, contract="rasr")
    assert [(s.name, s.options["features"]) for s in named] == [("rasr", "x")]


def test_the_built_in_steps_report_in_one_place(tmp_path):
    """``rasr=True`` and ``runtimes=`` are steps like any other: each has its entry in ``report.steps`` and its
    line in the summary; ``report.rasr`` and the JSON's "rasr" read the step's entry."""
    from models import Subsample, subsample_specs
    report = onnx_compat.export(Subsample(), str(tmp_path / "m.onnx"), *subsample_specs(), exporter="torchscript",
                                rasr=True, runtimes=[sys.executable])
    assert list(report.steps) == ["rasr", "runtimes"]
    assert report.rasr is report.steps["rasr"] and report.rasr["ok"] and report.rasr["roles"] == ["encoder"]
    assert report.rasr["names"] == {"features": "data", "features_size": "data:size1", "output": "output"}
    (name, counted), = report.steps["runtimes"]["runtimes"].items()
    elsewhere = [c for c in report.verification if c["runtime"] == name]
    assert counted == {"checks": len(elsewhere), "ok": len(elsewhere)} and len(elsewhere) >= 3
    summary = report.summary()
    assert "rasr        ok, fits encoder" in summary and f"runtime     {name}: {len(elsewhere)}/" in summary
    data = json.loads(report.to_json())
    assert data["rasr"] == data["steps"]["rasr"] and data["quantization"] is None
