"""The runtime-latency benchmark at its ``--quick`` size (TorchScript only), so it cannot rot. Nothing is timed
against a bound: the checks are that every graph it times was verified, and what the table says."""
import os
import sys

import pytest
from onnx import helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import latency_timing  # noqa: E402
import rewrite_latency  # noqa: E402
import runtime_latency  # noqa: E402


def test_quick_run_writes_its_block(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("intro\n<!-- runtime-latency -->\nSTALE TABLE\n<!-- /runtime-latency -->\noutro\n")
    results, rewrites = runtime_latency.main(["--quick", "--exporters", "torchscript", "--write", str(page)])
    text = page.read_text()
    assert "STALE TABLE" not in text and text.startswith("intro") and text.endswith("outro\n")
    assert "load average" in text and "| onnx_compat conv demo | 1 |" in text and "| onnx_compat conv demo | default |" in text
    for result in results:
        ours = {c.name: c for c in result["contenders"]}["ours torchscript"]
        assert ours.proto is not None and ours.nodes > 0, result["name"]
        for label, seconds in result["seconds"].items():
            assert seconds["ours torchscript"] > 0 and seconds["eager"] > 0, (result["name"], label)
    by = {r["name"]: r for r in rewrites}
    # the unpatched TorchScript export of adaptive pooling fails (docs/benchmarks.md, op tail), ours is timed
    assert by["adaptive_avg_pool1d"]["graphs"]["vanilla torchscript"] == "export fails"
    assert by["adaptive_avg_pool1d"]["seconds"]["ours torchscript"] > 0
    assert "| adaptive_avg_pool1d |" in text


def _proto(ops):
    nodes = [helper.make_node(op, ["x"], [f"y{k}"]) for k, op in enumerate(ops)]
    return helper.make_model(helper.make_graph(nodes, "g", [], []))


def test_slower_lists_our_graph_beyond_the_margin_with_its_ops():
    graphs = {"ours torchscript": _proto(["MatMul", "MatMul", "Where"]), "ours dynamo": _proto(["Conv"]),
              "vanilla dynamo": _proto(["Resize"])}
    result = {"name": "antialias_scale", "graphs": graphs,
              "seconds": {"ours torchscript": 3.0, "ours dynamo": 1.05, "vanilla dynamo": 1.0, "eager": 0.1}}
    lines = rewrite_latency.slower([result])
    assert lines == ["- antialias_scale: ours torchscript takes 3.00x vanilla dynamo "
                     "(antialiased resize as two MatMuls; ops MatMul x2, Where x1)"]
    result["seconds"]["ours torchscript"] = 1.08  # within 1.10x of the best: noise, not listed
    assert rewrite_latency.slower([result]) == ["- none beyond the noise margin (1.10x)"]


def test_interleaved_medians_times_every_contender_in_every_round():
    """A fake clock that each call advances by its contender's cost: the medians are exactly those costs."""
    calls, now = {"a": 0, "b": 0}, [0.0]

    def costing(name, seconds):
        def fn():
            calls[name] += 1
            now[0] += seconds
        return fn

    medians = latency_timing.interleaved_medians({"a": costing("a", 0.003), "b": costing("b", 0.005)}, rounds=4,
                                                 block_seconds=0.0, clock=lambda: now[0])
    assert medians == pytest.approx({"a": 0.003, "b": 0.005})
    assert calls == {"a": 2 + 4, "b": 2 + 4}  # two calls to size the block (0 s: one call each), then one a round
