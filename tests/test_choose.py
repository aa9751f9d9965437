"""``choose.faster``: of verified graphs, the one that runs faster in ONNX Runtime, with its ratio.

The two graphs compute the same thing; one also multiplies a 384 x 384 matrix
60 times, a gap of two orders of magnitude, so which one is faster is not a
question of the machine's load. No time is asserted, only the choice.
"""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_compat.errors import ExportError
from onnx_compat.pipeline.choose import Choice, deployed_session, faster
from onnx_compat.pipeline.verification import reference_cases
from onnx_compat.spec import Dim, TensorSpec


def _graph(extra_matmuls: int, broken: bool = False) -> onnx.ModelProto:
    """``y = 2 x`` for x [B, T, 8]; ``extra_matmuls`` dead-weight products feed a zero-scaled term."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y0"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    if extra_matmuls:
        rng = np.random.default_rng(0)
        inits += [numpy_helper.from_array(rng.standard_normal((384, 384)).astype(np.float32) / 20, "w"),
                  numpy_helper.from_array(np.zeros((1,), np.float32), "zero")]
        # the chain starts from the input, so ONNX Runtime cannot fold it away at load
        nodes += [helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0),
                  helper.make_node("Mul", ["w", "sx"], ["wx"])]
        prev = "wx"
        for k in range(extra_matmuls):
            nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{k}"]))
            prev = f"m{k}"
        nodes += [helper.make_node("ReduceSum", [prev], ["s"], keepdims=0),
                  helper.make_node("Mul", ["s", "zero"], ["z"]),
                  helper.make_node("Add", ["y0", "z"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    if broken:  # a Reshape to a shape that cannot hold the data fails when run
        inits.append(numpy_helper.from_array(np.array([7, 5], np.int64), "bad"))
        nodes.append(helper.make_node("Reshape", ["y", "bad"], ["y_bad"]))
    out = "y_bad" if broken else "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 8])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class Double(torch.nn.Module):
    def forward(self, x):
        return 2 * x


def _cases():
    inputs = [TensorSpec("x", [Dim("B"), Dim("T"), 8])]
    return reference_cases(Double(), inputs, [TensorSpec("y", [Dim("B"), Dim("T"), 8])])


def test_the_faster_graph_is_chosen_whichever_comes_first():
    cases = _cases()
    slow, fast = _graph(60), _graph(0)
    for order in (["slow", "fast"], ["fast", "slow"]):
        graphs = {k: {"slow": slow, "fast": fast}[k] for k in order}
        choice = faster(graphs, cases, rounds=3)
        assert choice.name == "fast", (order, choice)
        assert choice.ratios["fast"] == 1.0 and choice.ratios["slow"] > 1.5, choice.ratios
        assert "fast runs faster" in choice.why() and "slow" in choice.why()


def test_the_first_graph_is_kept_inside_the_margin():
    """The same graph twice: the first (preferred) one stays, whatever the noise says."""
    graph = _graph(0)
    choice = faster({"dynamo": graph, "torchscript": graph.SerializeToString()}, _cases(), rounds=3, margin=10.0)
    assert choice.name == "dynamo" and set(choice.ratios) == {"dynamo", "torchscript"}


def test_a_graph_kept_inside_the_margin_is_not_said_to_run_faster():
    """AudioSeal's report said "torchscript runs faster (dynamo 0.96x its time)": kept, not faster."""
    kept = Choice("torchscript", {"torchscript": 1.0, "dynamo": 0.96}, {"torchscript": 1.0, "dynamo": 0.96})
    assert "kept" in kept.why() and "torchscript runs faster" not in kept.why() and "dynamo 0.96x" in kept.why()
    won = Choice("dynamo", {"torchscript": 1.2, "dynamo": 1.0}, {"torchscript": 1.2, "dynamo": 1.0})
    assert "dynamo runs faster" in won.why()


def test_a_single_graph_is_chosen_without_timing():
    choice = faster({"torchscript": _graph(0)}, _cases())
    assert choice == Choice("torchscript", {}, {"torchscript": 1.0}) and "only verified" in choice.why()


def test_a_graph_that_fails_to_run_is_named():
    with pytest.raises(ExportError, match="broken: ONNX Runtime failed") as info:
        faster({"ok": _graph(0), "broken": _graph(0, broken=True)}, _cases())
    assert info.value.stage == "choose"


def test_no_graph_is_an_error():
    with pytest.raises(ValueError, match="at least one graph"):
        faster({}, [])


def test_verification_feeds_are_the_inputs_verification_runs():
    """Same sizes and values as ``reference_cases`` (which also runs the eager model), so the timing
    runs on what was proven."""
    from onnx_compat.pipeline.choose import verification_feeds
    from onnx_compat.pipeline.subject import Subject
    inputs = [TensorSpec("x", [Dim("B"), Dim("T"), 8])]
    outputs = [TensorSpec("y", [Dim("B"), Dim("T"), 8])]
    subject = Subject.build(Double(), inputs, outputs, seed=0)
    cases = reference_cases(Double(), inputs, outputs, example=subject.example, seed=subject.seed + 1)
    feeds = verification_feeds(subject)
    assert len(feeds) == len(cases) == 3
    for f, c in zip(feeds, cases):
        assert np.array_equal(f["x"], c.feeds["x"].numpy()), c.sizes


def test_worth_timing_names_the_op_that_made_the_other_exporter_faster():
    from onnx_compat.pipeline.choose import worth_timing
    loop = helper.make_model(helper.make_graph([helper.make_node("Loop", ["n", "c"], ["o"]),
                                                helper.make_node("MatMul", ["a", "b"], ["m"])], "g", [], []))
    assert worth_timing(loop, "torchscript").startswith("Loop: ONNX Loop (LSTMP")
    assert worth_timing(loop, "dynamo") is None  # dynamo writes Scan for LSTMP; a Loop there was not measured
    assert worth_timing(_graph(3), "torchscript") is None and worth_timing(_graph(3), "dynamo") is None


def _shaped(bookkeeping: int, compute: int, table_from_shape: bool = False) -> onnx.ModelProto:
    """x [B, T, 8] -> ``compute`` MatMuls with an 8 x 8 weight, then a Reshape to a shape computed from x's shape
    by ``bookkeeping`` integer nodes (Shape, then Gather/Add/Unsqueeze/Concat) - TorchScript's form of a size
    read with int(). ``table_from_shape``: the shape-derived values are also made float and multiplied into the
    output, a table a rewrite builds from the shapes (the model's work, not bookkeeping)."""
    inits = [numpy_helper.from_array(np.eye(8, dtype=np.float32), "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             helper.make_tensor("c", TensorProto.FLOAT, [], [1.0])]
    nodes, prev = [], "x"
    for k in range(compute):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{k}"]))
        prev = f"m{k}"
    nodes += [helper.make_node("Constant", [], ["c0"], value_int=0),
              helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "c0"], ["b0"])]
    for k in range(max(bookkeeping - 6, 0)):  # the batch size through a chain of no-op integer arithmetic
        nodes.append(helper.make_node("Add" if k % 2 else "Mul", [f"b{k}", "one"], [f"b{k + 1}"]))
    last = f"b{max(bookkeeping - 6, 0)}"
    nodes += [helper.make_node("Sub", [last, last], ["zero"]), helper.make_node("Add", ["b0", "zero"], ["batch"]),
              helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch1"]),
              helper.make_node("Concat", ["batch1", "minus1"], ["shape"], axis=0),
              helper.make_node("Reshape", [prev, "shape"], ["y0"])]
    if table_from_shape:
        nodes += [helper.make_node("Cast", ["zero"], ["zf"], to=TensorProto.FLOAT)]
        nodes += [helper.make_node("Mul", ["zf" if k == 0 else f"t{k - 1}", "c"], [f"t{k}"]) for k in range(20)]
        nodes += [helper.make_node("Add", ["t19", "c"], ["scale"]), helper.make_node("Mul", ["y0", "scale"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _runs(proto: onnx.ModelProto) -> None:
    """The synthetic graph is a valid one: ONNX Runtime runs it and gives x flattened per batch item."""
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    got = deployed_session(proto).run(None, {"x": x})[0]
    assert got.shape == (3, 40) and np.allclose(got, x.reshape(3, 40), atol=1e-5), got.shape


def test_bookkeeping_share_counts_integer_nodes_computed_from_shapes_only():
    from onnx_compat.pipeline.choose import bookkeeping_share
    mostly = _shaped(bookkeeping=30, compute=2)
    _runs(mostly)
    # 30 integer nodes of the 35 run (the Constant is not run), 2 MatMuls, Reshape and Identity use x's values
    assert bookkeeping_share(mostly) == pytest.approx(30 / 34), bookkeeping_share(mostly)
    table = _shaped(bookkeeping=6, compute=2, table_from_shape=True)
    _runs(table)
    # the 22 float nodes made from the shape (Cast, 20 Mul, Add) are a table, not bookkeeping
    assert bookkeeping_share(table) == pytest.approx(6 / 32), bookkeeping_share(table)


def test_worth_timing_a_torchscript_graph_mostly_shape_bookkeeping():
    """On each side of the threshold: a graph more than half bookkeeping is worth a dynamo export, one with
    less is kept alone; dynamo's own graphs have no bookkeeping rule."""
    from onnx_compat.pipeline.choose import BOOKKEEPING_SHARE, bookkeeping_share, worth_timing
    threshold = BOOKKEEPING_SHARE["torchscript"][0]
    above, below = _shaped(bookkeeping=12, compute=8), _shaped(bookkeeping=8, compute=12)
    assert bookkeeping_share(above) > threshold > bookkeeping_share(below), \
        (bookkeeping_share(above), bookkeeping_share(below))
    why = worth_timing(above, "torchscript")
    assert why is not None and why.startswith("shape bookkeeping 55% of the nodes: "), why
    assert worth_timing(below, "torchscript") is None
    assert worth_timing(above, "dynamo") is None


@pytest.mark.parametrize("model_type, task", [("wav2vec2", "ctc"), ("hubert", "ctc"), ("wavlm", "ctc"),
                                              ("whisper", "speech-encoder"),
                                              ("audio-spectrogram-transformer", "audio-classification"),
                                              ("wav2vec2-conformer", "ctc"), ("speech_to_text", "speech-encoder")])
def test_auto_exports_the_budgeted_transformers_models_once(tmp_path, model_type, task):
    """Issue #29 item 3: the whole export of these stays within optimum's time, so auto's rule must not
    ask for a second (dynamo) export of their verified TorchScript graphs."""
    pytest.importorskip("transformers")
    from onnx_compat.huggingface import export_pretrained, tiny
    folder = tiny.checkpoint(tmp_path / "c", model_type, task)
    report = export_pretrained(folder, str(tmp_path / "m.onnx"), task, exporter="auto")
    assert [a.exporter for a in report.attempts] == ["torchscript"] and report.speed is None, \
        (report.why, [a.exporter for a in report.attempts])
    assert all(c["ok"] for c in report.verification)


class Thumbnail(torch.nn.Module):
    """An antialiased bicubic resize to a fixed size: dynamo keeps ONNX Resize, which ran 2.16x slower than the
    TorchScript export's two MatMuls in the latency benchmark."""

    def forward(self, x):
        return torch.nn.functional.interpolate(x, size=(12, 12), mode="bicubic", antialias=True) * 2.0


class Projected(torch.nn.Module):
    """An LSTM with projections: TorchScript's graph holds an ONNX Loop, which ran 2.2-10.7x dynamo's Scan."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(6, 12, proj_size=4, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


@pytest.mark.skipif(not __import__("onnx_compat").versions.HAS_DYNAMO, reason="needs torch's dynamo exporter")
def test_auto_times_both_graphs_when_the_rule_says_so_and_writes_the_faster(tmp_path):
    import onnx_compat
    b, t = Dim("batch"), Dim("time")
    report = onnx_compat.export(Projected().eval(), str(tmp_path / "m.onnx"), [TensorSpec("data", [b, t, 6])],
                                [TensorSpec("output", [b, t, 4])], exporter="auto")
    assert [a.exporter for a in report.attempts] == ["torchscript", "dynamo"] and all(a.ok for a in report.attempts)
    assert report.speed["chosen"] == report.exporter and "timed: Loop" in report.why, report.why
    assert set(report.speed["ratios"]) >= {"dynamo", "torchscript"}, report.speed
    assert all(c["ok"] for c in report.verification)


def test_auto_keeps_the_first_graph_when_no_op_says_time_them(tmp_path):
    """TorchScript's two MatMuls are the fast form of an antialiased resize: no second export, no timing."""
    import onnx_compat
    b = Dim("batch")
    report = onnx_compat.export(Thumbnail(), str(tmp_path / "m.onnx"), [TensorSpec("data", [b, 3, 32, 32])],
                                [TensorSpec("output", [b, 3, 12, 12])], exporter="auto")
    assert [a.exporter for a in report.attempts] == ["torchscript"] and report.speed is None
    assert all(c["ok"] for c in report.verification)
