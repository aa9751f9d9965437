"""Each benchmark runs at a tiny size, so none can rot; each table it writes has its block in docs/. Not timed."""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import eager_overhead  # noqa: E402
import export_cost  # noqa: E402
import index  # noqa: E402
import padding_paths  # noqa: E402
import unseen_encoders  # noqa: E402
import readme_block  # noqa: E402
import zoo_report  # noqa: E402

from helpers import HAS_DYNAMO  # noqa: E402
import pytest  # noqa: E402

from onnx_compat import versions  # noqa: E402



from onnx_compat.pipeline import releases as targets


@pytest.mark.skipif(not HAS_DYNAMO, reason="the benchmark compares with the dynamo exporter")
def test_padding_paths_smoke(capsys):
    rows = padding_paths.main(["--tiny", "--runs", "1"])
    assert len(rows) == 16
    by = {(r[0], r[1]): r for r in rows}
    assert by[("dilated k=3 d=2", "torchscript native")][2].startswith("ORT fails")
    assert by[("even k=32", "torchscript + patch (asymmetric) + cleanup")][3] == by[("even k=32", "dynamo native")][3]
    assert "| stack |" in capsys.readouterr().out


def test_eager_overhead_smoke(tmp_path):
    """The ratio it returns is the one it writes, in its block, for the model and sizes it says."""
    page = tmp_path / "benchmarks.md"
    page.write_text("intro\n<!-- eager-overhead -->\nold\n<!-- /eager-overhead -->\n")
    ratio = eager_overhead.main(["--tiny", "--write", str(page)])
    text = page.read_text()
    assert "old" not in text and "Conformer 2 blocks, B=4, T=40" in text, text
    assert f"**{ratio:.3f}x**" in text and 0 < ratio < float("inf"), text


@pytest.mark.skipif(not versions.torch_at_least("2.1"),
                    reason="the baseline, an unpatched TorchScript export of string padding, fails on torch 2.0")
def test_export_cost_smoke(capsys):
    rows = export_cost.main(["--tiny", "--runs", "1", "--no-warm-up", "--no-dynamo"])  # its dynamo row: the same code
    assert [r[0] for r in rows][:2] == ["patch overhead", "pipeline cost"]
    assert all(float(r[2].rstrip("x")) > 0 for r in rows)
    assert "| ratio |" in capsys.readouterr().out


def test_unseen_encoders_smoke(tmp_path):
    """benchmarks/unseen_encoders.py on its own encoder at 2 x 32, one round, its table written (not timed)."""
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- unseen-encoders -->\nold\n<!-- /unseen-encoders -->\ny\n")
    results = unseen_encoders.main(["--tiny", "--rounds", "1", "--only", "time-first", "--write", str(page)])
    assert [m["label"] for m in results] == ["time-first MHA encoder 2 x 32"]
    m = results[0]
    assert m["bare"] > 0 and m["ours"] > 0 and not m["patched"] and m["nodes"][1] > 0
    assert set(m["split"]) == set(unseen_encoders.STAGES) and all(m["split"][k] > 0 for k in ("export", "cleanup", "ORT"))
    text = page.read_text()
    assert "old" not in text and "| time-first MHA encoder 2 x 32 |" in text and text.endswith("y\n")


def test_zoo_report_writes_its_table(tmp_path):
    page = tmp_path / "models.md"
    page.write_text("intro\n<!-- zoo:begin -->\nold\n<!-- zoo:end -->\noutro\n")
    rows = zoo_report.main(["--only", "onnx_compat conv demo", "--write", str(page)])
    text = page.read_text()
    assert len(rows) == 1 and "old" not in text and text.startswith("intro") and text.endswith("outro\n")
    vanilla = "ok (" if versions.torch_at_least("2.1") else "export fails"  # torch 2.0: aten::_convolution_mode
    assert f"| onnx_compat conv demo | {vanilla}" in text and "fits feature-scorer/encoder" in text


def test_op_tail_smoke(capsys, tmp_path):
    import op_tail
    page = tmp_path / "benchmarks.md"
    page.write_text("intro\n<!-- op-tail -->\nold\n<!-- /op-tail -->\noutro\n")
    rows = op_tail.main(["--only", "cumsum_bool", "--write", str(page)])
    text = page.read_text()
    assert "old" not in text and text.startswith("intro") and text.endswith("outro\n")
    assert "| cumsum_bool | torchscript | fails" in text
    assert [r[:2] for r in rows][0] == ("cumsum_bool", "torchscript")
    assert rows[0][2].startswith("fails") and rows[0][3] >= rows[0][4] > 0
    assert "| case |" in capsys.readouterr().out


def test_spectral_smoke(capsys):
    import spectral
    rows = spectral.main(["--seconds", "0.5", "--batch", "1", "--runs", "1", "--limit", "0",
                          "--exporters", "torchscript"])
    assert [r["case"] for r in rows] == ["log-mel front-end", "ISTFT head", "rfft of frames"]
    assert all(r["torchscript"] > 0 and r["torchscript err"] < 1e-4 for r in rows)
    assert "| case |" in capsys.readouterr().out


def test_deploy_table_smoke(capsys):
    import deploy_table
    rows = deploy_table.main(["--models", "BLSTM", "--exporters", "torchscript", "--python", "/nonexistent/python",
                              "--node", "/nonexistent"])
    opset, ir = (int(x) for x in rows[0][2].split(" / "))  # 19 / 9, or older where the exporter writes less
    expected = targets.opset_for("torchscript", None, targets.parse_target("onnxruntime==1.16"))
    assert rows == [("BLSTM", "torchscript", rows[0][2], rows[0][3])] and rows[0][3].startswith("3/3 ok")
    assert opset == expected <= 19 and ir <= 9
    out = capsys.readouterr().out
    assert "left out: runtime interpreter '/nonexistent/python' cannot be started" in out and "| BLSTM |" in out


def test_quantize_smoke(capsys):
    """benchmarks/quantize.py at its tiny size (not timed)."""
    import quantize as bench
    rows = bench.main(["--tiny", "--runs", "1", "--recipes", "int8-dynamic"])
    assert [r[1] for r in rows] == ["float", "int8-dynamic"] * 3
    assert all(r[2] != "-" for r in rows), [r for r in rows if r[2] == "-"]
    assert "| model | recipe |" in capsys.readouterr().out


def test_label_scorer_kv_cache_smoke(tmp_path):
    """benchmarks/label_scorer_latency.py's KV-cache table at its tiny size (not timed): the Transformer LM
    written as state-managed-onnx and full-context-onnx, both steps run, the table written into its block."""
    import label_scorer_latency
    page = tmp_path / "label_scorers.md"
    page.write_text("<!-- label_scorer_kv_cache -->\n<!-- /label_scorer_kv_cache -->\n")
    tables = label_scorer_latency.main(["--tiny", "--part", "kv-cache", "--write", str(page)])
    rows = tables["label_scorer_kv_cache"]
    assert [r.split(" | ")[:2] for r in rows[2:]] == [["| 1", "4"], ["| 8", "4"]], rows
    assert "| 8 | 4 | " in page.read_text()


def test_model_size_smoke():
    import model_size
    row = model_size.measure("tiny", "torchscript", "pipeline")
    assert row["files"] == ["model.onnx"] and row["max_abs_err"] < 1e-4 and row["peak_rss"] > row["weights"] > 0
    text = model_size.table([model_size.measure("tiny", "torchscript", "bare"), row])
    assert "| torchscript |" in text and "x |" in text


def test_matrix_table_from_a_run():
    import support_matrix as test_matrix
    rows = [{"venv": "v", "versions": {"torch": "2.1.2", "onnx": "1.16.2", "onnxruntime": "1.19.2", "numpy": "1.26.4"},
             "exporters": ["torchscript"], "available": ["conv_padding"], "unavailable": {"rms_norm": "lacks it"},
             "bundled": {n: {"exporter": "torchscript", "shapes": 3, "max_abs_err": 1e-6} for n in test_matrix.BUNDLED},
             "tests": {"counts": {"passed": 3, "skipped": 1}, "skips": {"no dynamo": 1}, "failures": [], "seconds": 1}}]
    assert "| 2.1.2 | 1.16.2 / 1.19.2 / - / 1.26.4 | torchscript | 1 (1) | 3 / 1 / 0 | torchscript, 3 shapes" in \
        test_matrix.table(rows)
    assert "patch rms_norm unavailable: lacks it" in test_matrix.details(rows)


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
_WRITES = re.compile(r'add_write_option\(\w+, "([\w-]+)", "([\w/.-]+)"\)')


def _written_tables():
    """(script, marker name, page) for every --write of benchmarks/, read from the scripts' own source."""
    found = []
    for script in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        with open(script, encoding="utf-8") as f:
            found += [(os.path.basename(script), name, page) for name, page in _WRITES.findall(f.read())]
    return found


def test_every_written_table_has_its_block_in_the_page_its_help_names():
    tables = _written_tables()
    assert len(tables) >= 8, tables
    for script, name, page in tables:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read()
        begin, end = (zoo_report.BEGIN, zoo_report.END) if name == "zoo" else (f"<!-- {name} -->", f"<!-- /{name} -->")
        assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), \
            f"{script} writes the {name} table into {page}, which has no single {begin} ... {end} block"


def test_a_page_without_the_block_is_refused_and_told_where_it_is(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("no tables here\n")
    expected = r"no <!-- export-cost --> \.\.\. <!-- /export-cost --> block.*docs/benchmarks\.md"
    with pytest.raises(SystemExit, match=expected):
        readme_block.write_marked(str(page), "| table |", "export-cost")
    assert page.read_text() == "no tables here\n"


def test_the_benchmark_index_is_current():
    """benchmarks/README.md is what benchmarks/index.py makes from the scripts' headers (every script has one
    or is a named helper: index() raises naming the script otherwise)."""
    with open(index.README, encoding="utf-8") as f:
        assert f.read() == index.render(index.index()), "benchmarks/README.md is stale: run benchmarks/index.py --write"


def test_each_header_names_the_page_its_write_option_names():
    declared = {s.path: s.writes for s in index.index() if s.cost}
    for script, name, page in _written_tables():
        assert declared[script] == page, f"{script}: BENCHMARK says it writes {declared[script]}, --write says {page}"
    assert {s.cost for s in index.index() if s.cost} == {"fast", "slow"}


def test_a_script_without_a_header_is_refused(tmp_path, monkeypatch):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "new_bench.py").write_text('"""Measures something."""\nprint(1)\n')
    monkeypatch.setattr(index, "HERE", str(tmp_path))
    with pytest.raises(ValueError, match="new_bench.py: neither a BENCHMARK header"):
        index.index()
    (tmp_path / "new_bench.py").write_text('"""Measures something."""\nBENCHMARK = {"cost": "quick"}\n')
    with pytest.raises(ValueError, match="cost in"):
        index.index()


def test_make_bench_runs_the_fast_class_with_each_write(capsys):
    calls = []
    assert index.run("fast", call=lambda argv, cwd: calls.append(argv[1:]) or 0) == 0
    fast = {s.path: s for s in index.index() if s.cost == "fast"}
    assert {os.path.relpath(argv[0], os.path.dirname(index.README)) for argv in calls} == set(fast)
    assert all(argv[1:] == ["--write", fast[os.path.basename(argv[0])].writes] for argv in calls), calls
    assert index.run("all", call=lambda argv, cwd: 3 if argv[1].endswith("op_tail.py") else 0) == 1
    assert "failed: op_tail.py" in capsys.readouterr().out


def _imported_names(path):
    import ast
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_benchmarks_and_tests_share_cases_only_through_the_package():
    """Case tables both sides use live in onnx_compat/models/*_cases.py: no benchmark imports a test module,
    and only the two smoke-test files import benchmark scripts (to run them at a tiny size)."""
    test_modules = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "tests", "*.py"))}
    bench_modules = {os.path.splitext(os.path.basename(p))[0]
                     for p in glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.py"), recursive=True)}
    for script in glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.py"), recursive=True):
        with open(script, encoding="utf-8") as f:
            assert '"tests"' not in f.read() or script.endswith("support_matrix.py"), f"{script} puts tests/ on the path"
        assert not _imported_names(script) & test_modules, f"{script} imports {_imported_names(script) & test_modules}"
    smoke = {"test_benchmarks", "test_runtime_latency"}
    for module in sorted(test_modules - smoke):
        used = _imported_names(os.path.join(ROOT, "tests", f"{module}.py")) & bench_modules
        assert not used, f"tests/{module}.py imports benchmark scripts {used}"


def test_the_sweep_environment_script_parses_and_pins_the_project_torch():
    """benchmarks/sweep/make_env.sh (not run here: it downloads the sweep's libraries) is valid bash and installs
    the torch constraints.txt pins, so the sweep measures the release the tests run."""
    import subprocess
    script = os.path.join(ROOT, "benchmarks", "sweep", "make_env.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True, text=True).returncode == 0
    with open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8") as f:
        torch_pin = next(line.strip() for line in f if line.startswith("torch=="))
    with open(script, encoding="utf-8") as f:
        text = f.read()
    assert torch_pin.split("+")[0] in text, f"make_env.sh does not install {torch_pin}"


def test_the_optimum_environment_script_parses_and_keeps_the_project_torch():
    """benchmarks/make_optimum_env.sh (not run here: it downloads optimum) is valid bash, installs the torch
    constraints.txt pins, and installs everything after torch under a constraints file, so optimum's requirements
    cannot replace it: the peer table compares the tools on one torch."""
    import subprocess
    script = os.path.join(ROOT, "benchmarks", "make_optimum_env.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True, text=True).returncode == 0
    with open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8") as f:
        torch_pin = next(line.strip() for line in f if line.startswith("torch=="))
    with open(script, encoding="utf-8") as f:
        installs = [line for line in f.read().replace("\\\n", " ").splitlines() if "pip\" install" in line]
    assert installs and installs[0].split()[-1] == torch_pin.split("+")[0], installs
    assert all(" -c " in line for line in installs[1:]), [line for line in installs[1:] if " -c " not in line]
