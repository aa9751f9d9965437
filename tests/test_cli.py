"""The CLI as a pipeline step: exit codes, one clear line, files."""
import json
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
    (["export", FACTORY, "--out", "{tmp}/no/m.onnx"], 1, "does not exist"),
    (["export", FACTORY, "--out", "{tmp}/m.onnx", "--size", "time"], 2, "KEY=VALUE"),
    (["inspect", "{tmp}/missing.onnx"], 1, "missing.onnx"),
], ids=["unknown_module", "unknown_callable", "missing_out_dir", "size_without_value", "inspect_missing_file"])
def test_failures_are_one_line_and_non_zero(argv, code, match, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == code
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


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
