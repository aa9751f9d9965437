"""The CLI as a pipeline step: exit codes, one clear line, files."""
import json
import os
import subprocess
import sys

import pytest

from onnx_compat.cli import main

FACTORY = "onnx_compat.models.conv_demo:build"


def test_export_inspect_verify(tmp_path, capsys):
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    assert main(["export", FACTORY, "--out", str(out), "--exporter", "torchscript", "--json", str(report), "--rasr",
                 "--metadata", "model_type=demo", "--size", "time=41"]) == 0
    data = json.loads(report.read_text())
    assert data["exporter"] == "torchscript" and data["rasr"]["ok"] and data["metadata"]["model_type"] == "demo"
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "input    data:size1 int32['batch']" in text and "rasr     ok" in text
    assert main(["verify", str(out), FACTORY]) == 0
    assert capsys.readouterr().out.count("ok  {'batch'") >= 3
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] > 0 and info["auto_pad"] == [] and info["rasr"]["ok"]


@pytest.mark.parametrize("argv, code, match", [
    (["export", "no_such_module:build", "--out", "{tmp}/m.onnx"], 2, "cannot import 'no_such_module'"),
    (["export", "onnx_compat.models.conv_demo:nope", "--out", "{tmp}/m.onnx"], 2, "no callable 'nope'"),
    (["export", FACTORY, "--out", "{tmp}/no/m.onnx"], 2, "does not exist"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--size", "time"], 2, "KEY=VALUE"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--size", "time=x"], 2, "'x' is not an int"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--size", "frames=100"], 2, "no input has a dim named 'frames'"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--metadata", "novalue"], 2, "--metadata takes KEY=VALUE"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--contract", "nope"], 2, "invalid choice: 'nope'"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--quantize", "nope"], 2, "invalid choice: 'nope'"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--exporter", "bogus"], 2, "invalid choice: 'bogus'"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--json", "{tmp}/no/r.json"], 2, "--json: cannot write the report"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--task", "ctc"], 2, "--task is for hf:DIR sources only"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--quantize", "fp16", "--no-verify"], 2, "needs verify=True"),
    (["export", FACTORY], 2, "the following arguments are required: --out"),
    (["bogus"], 2, "invalid choice: 'bogus'"),
    (["inspect", "{tmp}/missing.onnx"], 2, "onnx: no such file '{tmp}/missing.onnx'"),
    (["verify", "{tmp}/missing.onnx", FACTORY], 2, "no such file"),
    (["diagnose", FACTORY, "--size", "frames=3"], 2, "'frames'"),
    (["repair", "{tmp}/missing.onnx", "--out", "{tmp}/no/r.onnx"], 2, "--out: cannot write the repaired model"),
    (["export-streaming", "onnx_compat.models.lstm_encoder:streaming_job", "--out", "{tmp}/s.onnx",
      "--metadata", "x"], 2, "--metadata takes KEY=VALUE"),
    (["export-streaming", "onnx_compat.models.lstm_encoder:streaming_job", "--out", "{tmp}/no/s.onnx"], 2,
     "does not exist"),
    (["quantize", "{tmp}/m.onnx", FACTORY, "--recipe", "nope", "--report", "r.json"], 2, "invalid choice: 'nope'"),
    (["quantize", "{tmp}/m.onnx", FACTORY, "--recipe", "fp16", "--report", "{tmp}/r.json", "--threshold", "snr"], 2,
     "onnx: no such file"),
], ids=["unknown_module", "unknown_callable", "missing_out_dir", "size_without_value", "size_not_a_number",
        "size_of_no_dim", "metadata_without_value", "unknown_contract", "unknown_recipe", "unknown_exporter",
        "json_folder_missing", "task_without_hf", "quantize_without_verify", "no_out", "unknown_verb",
        "inspect_missing_file", "verify_missing_file", "diagnose_size_of_no_dim", "repair_out_folder_missing",
        "streaming_metadata", "streaming_out_folder_missing", "quantize_unknown_recipe", "quantize_missing_report"])
def test_failures_are_one_line_and_non_zero(argv, code, match, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == code
    err = capsys.readouterr().err.strip()
    assert match.format(tmp=tmp_path) in err and len(err.splitlines()) == 1, err
    assert err.startswith("onnx-compat: usage error: " if code == 2 else "onnx-compat: ModelFileError: ")
    assert list(tmp_path.iterdir()) == [], "a usage error is found before any work"


@pytest.mark.parametrize("verb", ["inspect", "repair", "quantize", "verify"])
def test_a_damaged_model_file_is_named(verb, tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07" + b"truncated\xff" * 8)
    (tmp_path / "r.json").write_text("{}")
    argv = {"inspect": ["inspect", str(bad)], "repair": ["repair", str(bad), "--out", str(tmp_path / "f.onnx")],
            "verify": ["verify", str(bad), FACTORY],
            "quantize": ["quantize", str(bad), FACTORY, "--recipe", "fp16", "--report", str(tmp_path / "r.json")]}
    assert main(argv[verb]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx-compat: ModelFileError: ") and str(bad) in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "r.json"]


def test_json_is_checked_before_the_export(tmp_path, capsys):
    """An unwritable --json used to be found after the whole export, which then exited 1 and left its model."""
    assert main(["export", FACTORY, "--out", str(tmp_path / "m.onnx"), "--exporter", "torchscript",
                 "--json", str(tmp_path / "m.onnx" / "r.json")]) == 2
    assert list(tmp_path.iterdir()) == []


def test_inspect_names_a_dynamic_dim_the_graph_does_not_have(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", FACTORY, "--out", str(out), "--exporter", "torchscript"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--dynamic", "nosuch:1"]) == 2
    err = capsys.readouterr().err
    assert "'nosuch'" in err and "dropped" not in err and len(err.strip().splitlines()) == 1
    assert main(["inspect", str(out), "--dynamic", "data:7"]) == 2
    assert "no axis 7" in capsys.readouterr().err


_INTERRUPTED = """
import torch
from onnx_compat import Dim, TensorSpec

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = torch.nn.Linear(4, 3), 0

    def forward(self, x):
        self.calls += 1
        if self.calls > {after}:
            raise KeyboardInterrupt
        return self.lin(x)

def build():
    return Net(), [TensorSpec("x", [Dim("batch"), 4])], [TensorSpec("y", [Dim("batch"), 3])]
"""


@pytest.mark.parametrize("after", [0, 1], ids=["at_once", "during_the_export"])
def test_ctrl_c_is_one_line_and_exit_130(after, tmp_path):
    (tmp_path / "interrupted_job.py").write_text(_INTERRUPTED.format(after=after))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run([sys.executable, "-m", "onnx_compat.cli", "export", "interrupted_job:build",
                             "--out", str(out / "m.onnx")], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "onnx-compat: interrupted", result.stderr
    assert list(out.iterdir()) == []


def test_every_verb_is_in_the_one_table_and_follows_the_exit_codes(capsys):
    import importlib
    from onnx_compat.cli import VERBS
    for verb, module in VERBS.items():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_parser) and callable(loaded.files) and callable(loaded.run), module
        assert main([verb, "--no-such-option"]) == 2, verb
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"onnx-compat: usage error: onnx-compat {verb}: ") and len(err.splitlines()) == 1, err
    assert main(["--help"]) == 0
    helped = capsys.readouterr().out
    assert all(verb in helped for verb in VERBS), helped


def test_the_verbs_import_no_cli_above_them():
    """quantization/ borrowed load_factory from the top CLI (an import circle through the pipeline); the shared
    helpers now live below every CLI module, in ``cli_args.py``."""
    code = ("import sys; import onnx_compat.quantization.cli, onnx_compat.streaming.cli, onnx_compat.verbs.export; "
            "print(sorted(m for m in sys.modules if m == 'onnx_compat.cli'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
    import pathlib
    import re
    package = pathlib.Path(__import__("onnx_compat").__file__).parent
    upward = re.compile(r"(from onnx_compat(\.cli)? import (cli\b|main\b|_parser))|(from onnx_compat\.cli import)|"
                        r"(import onnx_compat\.cli\b)")
    importers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                       if p.name != "cli.py" or p.parent != package
                       if upward.search(p.read_text(encoding="utf-8")))
    assert importers == [], f"these import the top CLI: {importers}"


def test_console_script_runs_as_a_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "onnx_compat.cli", "export", FACTORY, "--out", str(tmp_path / "m.onnx"),
                             "--exporter", "torchscript"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "verified" in result.stdout and (tmp_path / "m.onnx").exists()


def test_the_command_tunes_its_own_process_only_while_and_after_it_runs():
    """``onnx-compat`` collects garbage a tenth as often while it runs and freezes what is left when it is done
    (``command.py``); ``main`` called from a program changes nothing of the caller's collector."""
    code = ("import gc; from onnx_compat.command import run_command, YOUNG_EVERY; from onnx_compat.cli import main; "
            "t = gc.get_threshold(); seen = []; "
            "rc = run_command(lambda argv: seen.append(gc.get_threshold()) or 3); "
            "print(rc, seen[0][0] == YOUNG_EVERY * t[0], gc.get_threshold() == t, gc.get_freeze_count() > 0); "
            "gc.unfreeze(); main(['inspect', '/nonexistent.onnx']); print(gc.get_freeze_count(), gc.get_threshold() == t)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["3", "True", "True", "True", "0", "True"], result.stdout + result.stderr


def test_a_verb_loads_only_its_own_layers():
    """The CLI builds the parser of the verb it was given: ``export`` loads neither consumers, diagnosis,
    streaming nor quantization (``--help`` still lists every verb)."""
    code = ("import sys; from onnx_compat.cli import _parser; "
            "_parser('export').parse_args(['export', 'm:f', '--out', 'x.onnx']); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['onnx_compat', 'contracts'], "
            "['onnx_compat', 'diagnosis'], ['onnx_compat', 'streaming'], ['onnx_compat', 'quantization'])))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
    helped = subprocess.run([sys.executable, "-m", "onnx_compat.cli", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert all(verb in helped.stdout for verb in ("export-streaming", "quantize", "diagnose", "repair"))


def _demo_example(batch, time, seed=0):
    import numpy as np
    g = np.random.default_rng(seed)
    lengths = np.array([time] + [max(1, time - 5 * k) for k in range(1, batch)], dtype=np.int32)
    return {"data": g.standard_normal((batch, time, 40)).astype(np.float32), "data:size1": lengths}


def test_examples_file_is_the_export_example_and_is_verified(tmp_path, capsys):
    import numpy as np
    import torch
    np.savez(tmp_path / "one.npz", **_demo_example(2, 29))
    torch.save([{k: torch.from_numpy(v) for k, v in _demo_example(b, t, b).items()} for b, t in [(1, 17), (3, 44)]],
               tmp_path / "two.pt")
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    assert main(["export", FACTORY, "--out", str(out), "--exporter", "torchscript", "--json", str(report),
                 "--examples", str(tmp_path / "one.npz")]) == 0
    checks = json.loads(report.read_text())["verification"]
    assert [c["example"] for c in checks] == [False, False, False, True] and checks[-1]["sizes"] == {"batch": 2, "time": 29}
    capsys.readouterr()
    assert main(["verify", str(out), FACTORY, "--examples", str(tmp_path / "two.pt")]) == 0
    printed = capsys.readouterr().out
    assert "ok  example {'batch': 1, 'time': 17}" in printed and "ok  example {'batch': 3, 'time': 44}" in printed
    assert main(["verify", str(out), FACTORY, "--examples", str(tmp_path / "x.txt")]) == 2


class _Terminal:
    """stderr as a person's terminal."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.mark.parametrize("extra, shown", [([], True), (["--quiet"], False), (["--json", "{tmp}/r.json"], False)],
                         ids=["terminal", "quiet", "json"])
def test_progress_lines_on_a_terminal_only(extra, shown, tmp_path, monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["export", FACTORY, "--out", str(tmp_path / "m.onnx"), "--exporter", "torchscript"]
    assert main(argv + [a.format(tmp=tmp_path) for a in extra]) == 0
    lines = [line for line in terminal.text.splitlines() if line.startswith("onnx-compat [")]
    if shown:
        stages = [line.split("] ", 1)[1] for line in lines]
        assert stages[0] == "checking the model's outputs" and "capture (torchscript)" in stages, stages
        assert stages[-1] == "writing" and all("s] " in line for line in lines), lines
    else:
        assert lines == [], lines
    assert "onnx-compat [" not in capsys.readouterr().out


def test_no_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert main(["export", FACTORY, "--out", str(tmp_path / "m.onnx"), "--exporter", "torchscript"]) == 0
    assert "onnx-compat [" not in capsys.readouterr().err


def test_ctrl_c_while_torch_imports_is_one_line_and_exit_130(tmp_path):
    """The console script's first module catches an interrupt that arrives before the package has loaded."""
    interrupt_torch = ("import builtins, sys\n"
                       "real = builtins.__import__\n"
                       "def importing(name, *args, **kwargs):\n"
                       "    if name == 'torch' or name.startswith('torch.'):\n"
                       "        raise KeyboardInterrupt\n"
                       "    return real(name, *args, **kwargs)\n"
                       "builtins.__import__ = importing\n"
                       "sys.argv = ['onnx-compat', '--help']\n"
                       "import onnx_compat_cli\n"
                       "onnx_compat_cli.command()\n")
    result = subprocess.run([sys.executable, "-c", interrupt_torch], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "onnx-compat: interrupted", result.stderr


def test_the_console_script_starts_at_the_module_outside_the_package():
    from importlib.metadata import entry_points
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("onnx-compat") == "onnx_compat_cli:command"
    result = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['onnx-compat', '--help'];"
                             "import onnx_compat_cli; onnx_compat_cli.command()"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "export" in result.stdout, result.stderr


def test_label_scorer_prints_its_stages_on_a_terminal(tmp_path, monkeypatch, capsys):
    """Issue 45 (14): ``label-scorer`` was silent for a minute on a terminal while ``export`` said its stages; it
    says the rehearsal, each graph's export stages and the proof now, and nothing with --quiet."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["label-scorer", "onnx_compat.models.aed:ctc_label_scorer_job", "--exporter", "torchscript"]
    assert main(argv + ["--out", str(tmp_path / "shown")]) == 0
    stages = [line.split("] ", 1)[1] for line in terminal.text.splitlines() if line.startswith("onnx-compat [")]
    assert stages[0] == "rehearsing the callables in PyTorch", stages
    for graph in ("encoder", "scorer"):
        assert f"{graph}: capture (torchscript)" in stages and f"{graph}: writing" in stages, stages
    assert stages[-1] == "checking the graphs together", stages
    assert "onnx-compat [" not in capsys.readouterr().out
    from onnx_compat.cli import _parser
    from onnx_compat.cli_args import progress_for
    assert progress_for(_parser("label-scorer").parse_args(argv + ["--out", "x", "--quiet"])) is None


def test_quantize_measure_help_names_every_measure_that_applies_by_default(tmp_path, capsys):
    """Issue 45 (14): the help said "default snr and cosine" while top1 also applies to class scores; the help
    names every measure ``resolve`` picks by default for the demo's log-softmax output."""
    import onnx
    from onnx_compat.models.conv_demo import build
    from onnx_compat.quantization.measures import class_outputs, resolve
    out = tmp_path / "m.onnx"
    assert main(["export", FACTORY, "--out", str(out), "--exporter", "torchscript", "--quiet"]) == 0
    outputs = build()["outputs"]
    chosen = resolve(None, None, ["output"], class_outputs=class_outputs(outputs, onnx.load(str(out)).graph))
    names = [m.name for m in chosen["output"]]
    assert "top1" in names, names
    capsys.readouterr()
    assert main(["quantize", "--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    default = helped.split("--measure NAME|OUTPUT=NAME a measure", 1)[1].split("--threshold", 1)[0].split("default", 1)[1]
    assert all(name in default for name in names), default


JOBS = "onnx_compat.models.label_scorer_jobs"


def test_label_scorer_state_managed_full_context_and_their_notes(tmp_path, capsys):
    """Issue 46 (6): the verb writes the new kinds. The LSTM LM as state-managed-onnx, its note printed (its
    [B, S] states written for the transformer manager: RASR's lstm manager without encoder states meets
    undefined behaviour) and an earlier export's file it removed; the Transformer LM as full-context-onnx only
    with --release full-context-pr (RASR's open PR #241)."""
    folder = tmp_path / "lstm"
    folder.mkdir()
    (folder / "encoder.onnx").write_bytes(b"an earlier AED's encoder")
    (folder / "report.json").write_text(json.dumps({"files": {"encoder": str(folder / "encoder.onnx")}}))
    argv = ["label-scorer", f"{JOBS}:lstm_lm", "--manager", "transformer", "--exporter", "torchscript", "--beam", "2",
            "--out", str(folder)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "state-managed-onnx (transformer manager) for master" in out, out
    notes = [line for line in out.splitlines() if line.startswith("note ")]
    assert notes and any("lstm manager" in line for line in notes), out
    assert f"removed       {folder / 'encoder.onnx'}" in out and not (folder / "encoder.onnx").exists()
    report = json.loads((folder / "report.json").read_text())
    assert report["notes"] and report["manager"] == "transformer"
    assert main(argv[:2] + ["--manager", "lstm", "--out", str(tmp_path / "refused")]) == 1
    assert "402-404" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    full = tmp_path / "full"
    assert main(["label-scorer", f"{JOBS}:transformer_lm_full_context", "--release", "full-context-pr",
                 "--exporter", "torchscript", "--beam", "2", "--out", str(full)]) == 0
    out = capsys.readouterr().out
    assert "full-context-onnx for full-context-pr" in out, out
    assert "type = full-context-onnx" in (full / "label-scorer.config").read_text()


def test_label_scorer_combine_writes_and_proves_the_combination(tmp_path, capsys):
    """Issue 46 (6): ``--combine FACTORY=SCALE`` twice or more writes RASR's combine fragment over each
    scorer's folder and proves the combined search; the same scales as in the fragment, each scorer's folder
    there, and every decode's cost the same through the graphs as in PyTorch."""
    out_dir = tmp_path / "combined"
    assert main(["label-scorer", "--combine", f"{JOBS}:transformer_aed=1", "--combine", f"{JOBS}:transformer_lm=0.25",
                 "--exporter", "torchscript", "--beam", "2", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "combination   2 label scorers" in out and "scale 0.25" in out, out
    text = (out_dir / "label-scorer.config").read_text()
    assert "type = combine" in text and "scorer-2.scale = 0.25" in text and "scorer-1.scale = 1.0" in text
    report = json.loads((out_dir / "report.json").read_text())
    assert [s["role"] for s in report["scorers"]] == ["aed", "lm"]
    assert all(os.path.isdir(s["folder"]) for s in report["scorers"])
    assert {d["search"] for d in report["decodes"]} == {"greedy, label-synchronous", "beam 2, label-synchronous"}
    assert all(abs(d["cost_onnx"] - d["cost_pytorch"]) < 1e-3 for d in report["decodes"])
    assert any(d["labels"] for d in report["decodes"]), report["decodes"]


SHERPA = "onnx_compat.models.sherpa_jobs"


def _nemo_vocabulary(folder) -> list:
    """The tiny RNN-T's tokens renamed (upper case): tokens.txt must be these, not the model's."""
    from onnx_compat.models.nemo_transducer import vocabulary
    path = folder / "vocab.txt"
    path.write_text("".join(f"{t.upper()}\n" for t in vocabulary()) + "<blk>\n", encoding="utf-8")
    return ["--vocabulary", str(path)]


# contract -> (factory, extra options, (report key path, value the option must have put there))
FAMILIES = {
    "sherpa-onnx/vits": ("vits", lambda d: ["--metadata", "maintainer=cli"],
                         (("metadata", "model", "maintainer"), "cli")),
    "sherpa-onnx/matcha": ("matcha", lambda d: ["--opset", "17"], None),
    "sherpa-onnx/nemo-transducer": ("nemo_rnnt", _nemo_vocabulary, None),
    "sherpa-onnx/sense-voice": ("sense_voice", lambda d: ["--language", "en"], (("language",), "en")),
    "sherpa-onnx/paraformer": ("paraformer", lambda d: ["--atol", "0.001"], None),
}


@pytest.mark.parametrize("contract", list(FAMILIES))
def test_export_writes_each_family_writers_folder(contract, tmp_path, capsys):
    """``onnx-compat export MODULE:FACTORY --contract sherpa-onnx/FAMILY --out FOLDER`` (issue 49 Deliver 5, issue
    48): the factory's keyword arguments reach the family writer with the options over them; the folder holds the
    contract's files, each graph verified in ONNX Runtime against eager PyTorch at several lengths (TorchScript,
    no sherpa-onnx proof: that is the writers' tests')."""
    from onnx_compat.verbs.export import FOLDER_CONTRACTS
    factory, extra, routed = FAMILIES[contract]
    out, report_path = tmp_path / "folder", tmp_path / "report.json"
    code = main(["export", f"{SHERPA}:{factory}", "--contract", contract, "--out", str(out), "--exporter",
                 "torchscript", "--no-verify", "--json", str(report_path), *extra(tmp_path)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert sorted(os.listdir(out)) == sorted(FOLDER_CONTRACTS[contract].files)
    assert printed.out.startswith(f"{contract}  {out}") and "not run (--no-verify)" in printed.out, printed.out
    report = json.loads(report_path.read_text())
    assert report["consumer_checks"] == []
    for name, graph in report["parts"]["graphs"].items():
        assert graph["exporter"] == "torchscript" and graph["why"] == "requested", name
        runs = graph["verification"]
        assert len(runs) >= 2 and all(r["ok"] for r in runs), (name, runs)
        lively = {o["name"] for r in runs for o in r["outputs"] if not o["degenerate"]}
        assert lively == {o["name"] for o in runs[0]["outputs"]}, (name, runs)  # each output varies somewhere
    if routed:
        keys, value = routed
        got = report
        for key in keys:
            got = got[key]
        assert got == value
    if contract == "sherpa-onnx/nemo-transducer":
        assert (out / "tokens.txt").read_text().splitlines()[0].split()[0].isupper()
