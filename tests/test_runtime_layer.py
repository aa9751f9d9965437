"""The runtime layer: ONNX Runtime opened in one place, one rule for "close enough", one for a degenerate reference."""
import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_compat.runtimes import compare
from onnx_compat.runtimes.compare import closeness, degenerate, valid_mask
from onnx_compat.runtimes.session import open_session
from onnx_compat.streaming import verify_stream
from onnx_compat import testing
from onnx_compat.pipeline import verification

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "onnx_compat"
RUNTIME_LAYER = PACKAGE / "runtimes"


def _session_constructions(path: pathlib.Path):
    """Calls of ``InferenceSession(...)`` or ``SessionOptions(...)`` in a file, by any spelling (``ort.X``, ``X``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("InferenceSession", "SessionOptions"):
                yield f"{path.name}:{node.lineno} {name}"


def test_onnx_runtime_is_opened_only_in_the_runtime_layer():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if RUNTIME_LAYER not in path.parents
             for hit in _session_constructions(path)]
    assert not found, f"open ONNX Runtime through onnx_compat.runtimes.session.open_session: {found}"
    assert list(_session_constructions(RUNTIME_LAYER / "session.py")), "the layer itself is seen"


def test_close_enough_is_decided_only_by_the_runtime_layer():
    """No ``np.allclose``, ``torch.allclose``, ``np.testing.assert_allclose`` or ``isclose`` of its own: each had
    its own NaN rule."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if RUNTIME_LAYER in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("allclose", "isclose", "assert_allclose", "assert_close"):
                found.append(f"{path.name}:{node.lineno} {node.func.attr}")
    assert not found, f"compare through onnx_compat.runtimes.compare.closeness: {found}"


def test_the_source_check_sees_a_session_built_outside(tmp_path):
    """The check above can fail: it finds both spellings in a file, and not the words in a string."""
    (tmp_path / "m.py").write_text("import onnxruntime as ort\nfrom onnxruntime import SessionOptions\n"
                                   "s = ort.InferenceSession(b'', SessionOptions())\n"
                                   "doc = 'ort.InferenceSession(model)'\n")
    assert sorted(h.split(" ")[-1] for h in _session_constructions(tmp_path / "m.py")) == \
        ["InferenceSession", "SessionOptions"]


def test_the_runtime_layer_does_not_import_the_pipeline():
    for path in RUNTIME_LAYER.rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in modules if "pipeline" in m.split(".")], f"{path.name} imports the pipeline"


def test_importing_the_runtime_layer_loads_no_pipeline_and_no_torch():
    code = ("import sys, onnx_compat.runtimes.compare, onnx_compat.runtimes.session; "
            "print(sorted(m for m in sys.modules if m.startswith('onnx_compat.pipeline') or m == 'torch'))")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    # the package's __init__ loads torch and the pipeline: import the layer's files without it
    loader = ("import importlib.util, sys, types; pkg = types.ModuleType('onnx_compat'); "
              f"pkg.__path__ = [{str(PACKAGE)!r}]; sys.modules['onnx_compat'] = pkg; ")
    done = subprocess.run([sys.executable, "-c", loader + code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


# --- opening a session -------------------------------------------------------------------------------------------

def _double() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")  # raw bytes: may be saved apart
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "g", [x], [y], [two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_path_a_proto_and_bytes_open_the_same_graph(tmp_path):
    proto = _double()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    x = np.arange(3, dtype=np.float32)
    for model in (proto, proto.SerializeToString(), str(path), path):
        np.testing.assert_array_equal(open_session(model).run(None, {"x": x})[0], 2 * x)


def test_a_session_passes_through_and_settings_are_applied():
    sess = open_session(_double(), threads=2, optimization="basic", prepack=False)
    assert open_session(sess) is sess
    opts = sess.get_session_options()
    assert opts.intra_op_num_threads == 2 and opts.inter_op_num_threads == 1
    assert opts.graph_optimization_level.name == "ORT_ENABLE_BASIC"
    assert opts.get_session_config_entry("session.disable_prepacking") == "1"
    assert open_session(_double(), threads=None).get_session_options().intra_op_num_threads == 0
    calm = open_session(_double(), threads=2, spinning=False).get_session_options()
    assert calm.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_the_optimised_graph_is_saved_with_its_weights_apart(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512])
    w = helper.make_tensor("w", TensorProto.FLOAT, [512], np.linspace(0, 1, 512, dtype=np.float32))
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Add", ["i", "w"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    saved = tmp_path / "opt.onnx"
    open_session(proto, optimization="basic", save_optimized=saved, saved_weights="opt.data")
    written = onnx.load(str(saved))
    assert (tmp_path / "opt.data").stat().st_size == 512 * 4  # the 2 KB weight apart, as raw bytes
    assert [n.op_type for n in written.graph.node] == ["Add"]  # the Identity removed: optimised at "basic"


def test_external_data_is_found_beside_a_path_or_in_the_folder_given(tmp_path):
    proto = _double()
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    bare = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    x = np.arange(3, dtype=np.float32)
    for model, folder in ((tmp_path / "m.onnx", None), (bare, tmp_path), (bare.SerializeToString(), tmp_path)):
        np.testing.assert_array_equal(open_session(model, external_data=folder).run(None, {"x": x})[0], 2 * x)
    with pytest.raises(ValueError, match="keeps its weights in external files"):
        open_session(bare)


def test_a_bad_setting_or_model_is_refused():
    with pytest.raises(ValueError, match="optimization must be one of"):
        open_session(_double(), optimization="fast")
    with pytest.raises(TypeError, match="a path, a ModelProto, bytes or an InferenceSession"):
        open_session(42)


# --- the comparison rule ----------------------------------------------------------------------------------------

def test_values_within_atol_plus_rtol_of_the_reference_are_close():
    want = np.array([1.0, -2.0, 100.0])
    edge = want + (1e-4 + 1e-3 * np.abs(want)) * 0.999  # just inside: atol + rtol * |expected|
    assert closeness(edge, want, 1e-4, 1e-3).ok
    out = want.copy()
    out[2] += (1e-4 + 1e-3 * 100.0) * 1.01  # just outside, at the largest value
    got = closeness(out, want, 1e-4, 1e-3)
    assert not got.ok and got.mismatched == 1 and got.size == 3
    assert got.max_abs_err == pytest.approx(0.1001 * 1.01)
    assert "Mismatched elements: 1 / 3" in got.describe(1e-4, 1e-3)


def test_the_tolerance_is_relative_to_the_reference_not_to_the_output():
    # |got - want| = 1, rtol 0.5: close against want = 2 (bound 1), not against want = 1 (bound 0.5)
    assert closeness(np.array([1.0]), np.array([2.0]), 0.0, 0.5).ok
    assert not closeness(np.array([2.0]), np.array([1.0]), 0.0, 0.5).ok


def test_nan_in_both_at_the_same_place_is_close():
    want = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    got = closeness(want.copy(), want, 1e-6, 0)
    assert got.ok and got.max_abs_err == 0.0 and got.nonfinite is None


def test_nan_in_one_only_or_elsewhere_is_a_mismatch():
    want = np.array([1.0, np.nan, 3.0])
    for got in (np.array([1.0, 2.0, 3.0]), np.array([1.0, np.nan, np.nan]), np.array([np.nan, 2.0, 3.0])):
        result = closeness(got, want, 1e9, 1e9)  # no tolerance excuses it
        assert not result.ok and result.max_abs_err == float("inf"), got
        assert "non-finite" in result.describe(1e9, 1e9)
    assert not closeness(np.array([np.nan]), np.array([1.0]), 1e9, 1e9).ok  # NaN only in the output


def test_inf_matches_only_the_same_inf():
    want = np.array([np.inf, -np.inf, 0.5])
    assert closeness(want.copy(), want, 0, 0).ok
    assert not closeness(np.array([-np.inf, -np.inf, 0.5]), want, 1e9, 1e9).ok  # the sign
    assert not closeness(np.array([np.nan, -np.inf, 0.5]), want, 1e9, 1e9).ok  # NaN is not inf
    assert not closeness(np.array([1e38, -np.inf, 0.5]), want, 1e9, 1e9).ok  # large is not infinite


def test_integers_and_booleans_are_equal_or_not():
    assert closeness(np.array([3, 1500]), np.array([3, 1500]), 1e-4, 1e-3).ok
    assert not closeness(np.array([3, 1501]), np.array([3, 1500]), 1e-4, 1e-3).ok  # inside rtol, still a wrong id
    assert not closeness(np.array([True, False]), np.array([True, True]), 1, 1).ok


def test_rtol_relative_to_the_largest_value_judges_a_whole_output():
    want = np.array([100.0, 0.01])
    got = np.array([100.0, 0.05])  # 0.04 off a value of 0.01, well within 1e-3 of the output's 100
    assert closeness(got, want, 0.0, 1e-3, relative_to="largest").ok
    assert not closeness(got, want, 0.0, 1e-3).ok
    with_nan = closeness(np.array([100.0, np.nan, 0.05]), np.array([100.0, np.nan, 0.01]), 0.0, 1e-3,
                         relative_to="largest")
    assert with_nan.ok and with_nan.max_abs_err == pytest.approx(0.04)  # the scale is the finite values'
    with pytest.raises(ValueError, match="relative_to"):
        closeness(got, want, 0.0, 1e-3, relative_to="max")


def test_shapes_and_masks():
    assert not closeness(np.zeros((2, 3)), np.zeros((3, 2)), 1, 1).ok
    assert "shapes differ: [2, 3] vs [3, 2]" in closeness(np.zeros((2, 3)), np.zeros((3, 2)), 1, 1).describe()
    want = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = want.copy()
    got[0, 3] = 99.0  # beyond the first sequence's length of 3: padding is free to differ
    mask = valid_mask(want.shape, {1: np.array([3, 4])})
    assert closeness(got, want, 0, 0, mask).ok and not closeness(got, want, 0, 0).ok


def test_tensors_are_compared_like_arrays():
    want = torch.tensor([1.0, float("nan")])
    assert closeness(want.clone(), want, 0, 0).ok
    assert not closeness(torch.tensor([1.0, 0.0]), want, 1, 1).ok


# --- the degenerate rule ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("reference,why", [
    (np.zeros((2, 5)), "all zeros"),
    (np.full((4,), 3.0), "std"),
    (1e4 + 1e-3 * np.random.default_rng(0).standard_normal(100), "std"),  # a constant plus round-off
    (np.array([], dtype=np.float32), "no finite value"),
    (np.array([np.nan, np.nan]), "no finite value"),
    (np.array([0.0]), "all zeros"),
])
def test_a_reference_that_cannot_tell_right_from_wrong_is_degenerate(reference, why):
    assert why in (degenerate(reference) or "")


@pytest.mark.parametrize("reference", [
    1e-2 * np.random.default_rng(0).standard_normal(100),  # small but varying: the floor is relative
    np.array([0.37]),  # one value (a per-utterance score at batch 1) cannot spread
    np.array([1.0, np.nan, 2.0]),  # NaN is compared, not measured
    np.array([0, 5, 7]),
])
def test_a_varying_reference_is_not(reference):
    assert degenerate(reference) is None


def test_the_floor_is_the_spread_constant_times_the_largest_magnitude():
    """``c + s * [1, -1, ...]`` has std ``s`` and max ``c + s``: degenerate just below the floor, not above."""
    alternating = np.array([1.0, -1.0] * 50)
    below, above = 1.0 + 0.9e-3 * alternating, 1.0 + 1.1e-3 * alternating
    assert compare.DEGENERATE_SPREAD == 1e-3
    assert degenerate(below) is not None and degenerate(above) is None


# --- every caller uses the rules --------------------------------------------------------------------------------

def test_verification_streaming_and_testing_agree_on_one_case():
    """The same pairs give the same verdict in verification, streaming and ``testing``."""
    want = np.array([1.0, np.nan, np.inf, 4.0], dtype=np.float32)
    pairs = [(want.copy(), True), (np.array([1.0, 2.0, np.inf, 4.0], dtype=np.float32), False),
             (np.array([1.0, np.nan, -np.inf, 4.0], dtype=np.float32), False),
             (np.array([1.0005, np.nan, np.inf, 4.0], dtype=np.float32), False)]
    mask = np.ones(want.shape, dtype=bool)
    for got, ok in pairs:
        assert verification.compare(got, want, mask, "y", 1e-4, 1e-4).ok is ok, got
        assert verify_stream._close(torch.from_numpy(got), torch.from_numpy(want), 1e-4, 1e-4) is ok, got
        try:
            testing.allclose(got, want, 1e-4, 1e-4)
            agreed = True
        except AssertionError:
            agreed = False
        assert agreed is ok, got


def test_verification_flags_what_the_rule_calls_degenerate():
    mask = np.ones((3,), dtype=bool)
    assert verification.compare(np.zeros(3), np.zeros(3), mask, "y", 1e-4, 1e-3).degenerate
    assert verification.compare(np.full(3, 7.0), np.full(3, 7.0), mask, "y", 1e-4, 1e-3).degenerate
    assert not verification.compare(np.arange(3.0), np.arange(3.0), mask, "y", 1e-4, 1e-3).degenerate
    with pytest.raises(AssertionError, match="where: degenerate reference output: all zeros"):
        testing.assert_not_degenerate(np.zeros(3), "where")
