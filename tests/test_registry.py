"""patched(): exact restore, nesting, threads, selection, aliases, trace and script."""
import sys
import threading
import types

import pytest
import torch
import torch.nn.functional as F
import wrapt

import onnx_compat
from onnx_compat.patches import registry
from onnx_compat.patches.changes import Changes
from onnx_compat.patches.registry import Patch

from helpers import auto_pads, export, vanilla_string_padding_failure


def _snapshot():
    """The current object of every target of the patches usable here (patched() applies those)."""
    registry._load_families()
    out = {}
    for patch in registry._REGISTRY.values():
        if patch.unavailable() is not None:
            continue
        for target in patch.targets:
            found = registry._resolve(target)
            if found:  # as the registry reads it: a classmethod is its descriptor (getattr binds it anew)
                out[target] = registry._own_value(*found)
    return out


def _is_patched():
    return isinstance(F.conv1d, wrapt.FunctionWrapper)


def test_available_patches_lists_conv_padding():
    patches = onnx_compat.available_patches()
    assert "conv_padding" in patches
    assert all(isinstance(d, str) and d and "\n" not in d for d in patches.values())


def test_restored_to_the_very_objects_after_exit():
    before = _snapshot()
    with onnx_compat.patched():
        assert _is_patched()
        during = _snapshot()
        assert all(during[k] is not before[k] for k in before)
    after = _snapshot()
    assert all(after[k] is before[k] for k in before)
    assert registry.applied_patches() == []


def test_restored_after_an_exception():
    before = _snapshot()
    with pytest.raises(KeyError):
        with onnx_compat.patched():
            raise KeyError("boom")
    assert all(_snapshot()[k] is v for k, v in before.items())


def test_restore_targets_what_was_there_at_entry(monkeypatch):
    ctx = onnx_compat.patched()          # built before the user swaps in their own conv
    mine = lambda *a, **k: "mine"        # noqa: E731
    monkeypatch.setattr(F, "conv1d", mine)
    with ctx:
        assert F.conv1d.__wrapped__ is mine
    assert F.conv1d is mine


def test_decorator_form():
    @onnx_compat.patched()
    def inside():
        return _is_patched()

    assert inside() and inside()
    assert not _is_patched()


def test_nested_keeps_patches_until_the_outer_exit():
    with onnx_compat.patched():
        proxy = F.conv1d
        with onnx_compat.patched():
            assert F.conv1d is proxy     # not wrapped twice
        assert F.conv1d is proxy
    assert not _is_patched()


def test_threads_patch_on_first_entry_and_restore_on_last_exit():
    before = _snapshot()
    barrier = threading.Barrier(8)
    seen, errors = [], []

    def worker():
        try:
            with onnx_compat.patched():
                barrier.wait(timeout=20)
                seen.append(_is_patched())
                barrier.wait(timeout=20)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and seen == [True] * 8
    assert all(_snapshot()[k] is v for k, v in before.items())


def test_only_exclude_and_unknown_names():
    assert onnx_compat.patched(only=["conv_padding"]).names == ("conv_padding",)
    assert "conv_padding" not in onnx_compat.patched(exclude=["conv_padding"]).names
    with pytest.raises(ValueError, match="conv_paddin'"):
        onnx_compat.patched(only=["conv_paddin"])
    with pytest.raises(ValueError, match="nope"):
        onnx_compat.patched(exclude=["nope"])
    with pytest.raises(TypeError, match="list"):
        onnx_compat.patched(only="conv_padding")
    with onnx_compat.patched(exclude=["conv_padding"]):
        assert not _is_patched()


def test_wrappers_are_transparent():
    original = F.conv2d
    with onnx_compat.patched():
        assert F.conv2d.__wrapped__ is original
        assert F.conv2d.__name__ == original.__name__
        assert F.conv2d.__doc__ == original.__doc__
        assert torch.conv2d is F.conv2d   # one proxy for one object


def test_eager_forward_is_bit_identical_inside():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 4, padding="same", dilation=3),
                                torch.nn.Conv1d(4, 4, 3, padding="valid")).eval()
    x = torch.randn(2, 3, 31)
    outside = model(x)
    with onnx_compat.patched():
        inside = model(x)
    assert torch.equal(inside, outside)


def test_aliases_in_user_modules_are_rebound_and_restored():
    mod = types.ModuleType("user_model_with_alias")
    exec("from torch.nn.functional import conv1d\n"
         "def same(x, w):\n    return conv1d(x, w, padding='same', dilation=2)\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        original = mod.conv1d
        with onnx_compat.patched():
            assert mod.conv1d is F.conv1d and mod.conv1d is not original
        assert mod.conv1d is original

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(4, 3, 4))

            def forward(self, x):
                return mod.same(x, self.w)

        with onnx_compat.patched():
            proto = export(M(), (torch.randn(2, 3, 20),), "torchscript", {0: {0: "B", 2: "T"}})
        assert auto_pads(proto) == []
    finally:
        del sys.modules[mod.__name__]


def test_aliases_made_after_a_block_are_found_by_the_next():
    """The alias scan remembers each module's names between blocks (it read ~2,600 namespaces per block):
    a name added to a module already read, and a module replaced under its name, are read again."""
    original = F.conv1d
    mod = types.ModuleType("user_module_growing_aliases")
    sys.modules[mod.__name__] = mod
    try:
        with onnx_compat.patched():
            pass  # the module is read here, holding no alias yet
        exec("from torch.nn.functional import conv1d", mod.__dict__)
        with onnx_compat.patched():
            assert F.conv1d is not original and mod.conv1d is F.conv1d
        assert mod.conv1d is original
        other = types.ModuleType(mod.__name__)
        exec("from torch.nn.functional import conv1d as c", other.__dict__)
        other.__dict__.update({"a": 1, "b": 2})  # as many names as the module it replaces: read as another module
        sys.modules[mod.__name__] = other
        with onnx_compat.patched():
            assert F.conv1d is not original and other.c is F.conv1d
        assert other.c is original
    finally:
        del sys.modules[mod.__name__]


def test_alias_limit_closures_are_not_rebound():
    """Documented limit: only module globals are rebound, not captured references."""
    def make():
        fn = F.conv1d
        return lambda: fn
    captured = make()
    with onnx_compat.patched():
        assert captured() is not F.conv1d


def test_a_proxy_kept_after_exit_is_inert():
    with onnx_compat.patched():
        leaked = F.conv1d
    w = torch.randn(4, 3, 3)

    class M(torch.nn.Module):
        def forward(self, x):
            return leaked(x, w, padding="same")

    # the leaked proxy must not act: the export fails as an unpatched one does
    vanilla_string_padding_failure(M(), (torch.randn(2, 3, 20),), {0: {0: "B", 2: "T"}})


def _trace_graph(during_trace):
    model = torch.nn.Conv1d(3, 4, 4, padding="same", dilation=3).eval()  # asymmetric: (4, 5)
    with onnx_compat.patched(during_trace=during_trace):
        traced = torch.jit.trace(model, (torch.randn(2, 3, 20),))
    return str(traced.inlined_graph)


def test_during_trace_acts_inside_plain_jit_trace():
    assert "_convolution_mode" in _trace_graph(False)
    graph = _trace_graph(True)
    assert "_convolution_mode" not in graph
    assert "aten::pad" in graph or "constant_pad_nd" in graph


def test_jit_script_while_patched():
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 5, padding="same"), torch.nn.ReLU()).eval()

    def fn(x, w):
        return F.conv2d(x, w, padding="same")

    with onnx_compat.patched():
        scripted = torch.jit.script(model)
        scripted_fn = torch.jit.script(fn)
    x = torch.randn(1, 3, 17)
    assert torch.equal(scripted(x), model(x))
    x2, w2 = torch.randn(1, 2, 6, 7), torch.randn(3, 2, 3, 3)
    assert torch.equal(scripted_fn(x2, w2), fn(x2, w2))


def test_a_failed_apply_rolls_back(monkeypatch):
    bad = Patch(name="bad", description="cannot be applied", targets=("builtins:int.bit_length",),
                wrapper=lambda w, i, a, k: w(*a, **k), aliases=False)
    monkeypatch.setitem(registry._REGISTRY, "bad", bad)
    before = _snapshot()
    with pytest.raises(TypeError):
        with onnx_compat.patched(only=["conv_padding", "bad"]):
            pass
    assert not _is_patched() and registry.applied_patches() == []
    assert all(_snapshot()[k] is v for k, v in before.items() if k in before)


def test_registering_a_clashing_patch_is_refused():
    clash = Patch(name="clash", description="x", targets=("torch.nn.functional:conv1d",),
                  wrapper=lambda w, i, a, k: w(*a, **k))
    with pytest.raises(ValueError, match="conv_padding"):
        registry.register(clash)
    with pytest.raises(ValueError, match="when"):
        Patch(name="x", description="x", targets=(), wrapper=None, when="sometimes")


def test_changes_undo_in_reverse_and_inherited_attributes():
    class Base:
        attr = "base"

    class Child(Base):
        pass

    changes = Changes()
    changes.setattr(Child, "attr", "one")
    changes.setattr(Child, "attr", "two")
    assert Child.attr == "two" and len(changes) == 2
    changes.undo()
    assert Child.attr == "base" and "attr" not in vars(Child)
    with pytest.raises(AttributeError):
        changes.setattr(Child, "no_such_attr", 1)


def test_requires_selects_dependencies_and_refuses_to_exclude_them():
    if "packed_sequences" not in onnx_compat.available_patches():
        pytest.skip("this torch has no custom ops / translation table")
    assert set(onnx_compat.patched(only=["packed_sequences"]).names) == {
        "packed_sequences", "rnn_dynamic_time", "onnx_translations"}
    with pytest.raises(ValueError, match="needs 'onnx_translations'"):
        onnx_compat.patched(exclude=["onnx_translations"])


def test_every_patch_says_what_it_fixes():
    """The README's patch list names each of these (docs/patches.md has the table)."""
    with open(__file__.rsplit("/tests/", 1)[0] + "/README.md", encoding="utf-8") as f:
        readme = f.read()
    for name in onnx_compat.available_patches():
        assert f"`{name}`" in readme, name


@pytest.fixture
def scratch():
    """A module-level function and patches on it, removed afterwards."""
    module = types.ModuleType("onnx_compat_scratch_target")
    module.double = lambda x: x * 2
    sys.modules[module.__name__] = module
    names = []

    def add(**kwargs):
        patch = Patch(targets=(f"{module.__name__}:double",), wrapper=lambda w, i, a, k: w(*a, **k) + 1,
                      description="x", **kwargs)
        registry.register(patch)
        names.append(patch.name)
        return patch
    yield module, add
    for name in names:
        registry._REGISTRY.pop(name, None)
    del sys.modules[module.__name__]


def test_a_patch_for_a_newer_torch_names_the_release_and_cannot_be_chosen(scratch):
    _, add = scratch
    add(name="from_the_future", min_torch="99.0")
    assert "from_the_future" not in onnx_compat.available_patches()
    reason = onnx_compat.unavailable_patches()["from_the_future"]
    assert reason == f"needs torch >= 99.0 (this is {torch.__version__})"
    with pytest.raises(RuntimeError, match=r"patch 'from_the_future' is not available here: needs torch >= 99\.0"):
        with onnx_compat.patched(only=["from_the_future"]):
            pass


def test_a_patch_steps_aside_where_torch_does_it_right(scratch):
    """native={exporter: release}: from that release on, the wrapper is not called under that exporter."""
    module, add = scratch
    add(name="fixed_long_ago", native={"torchscript": "2.0"}, when="export")
    seen = []

    class M(torch.nn.Module):
        def forward(self, x):
            seen.append(module.double(3))
            return x * 2

    with onnx_compat.patched(only=["fixed_long_ago"]):
        export(M(), (torch.randn(2, 3),), "torchscript", {0: {0: "batch"}})
    assert seen == [6]  # the original ran: torch >= 2.0 does it right
    assert registry.steps_aside("fixed_long_ago", "torchscript") and not registry.steps_aside("fixed_long_ago", "dynamo")
    registry._REGISTRY.pop("fixed_long_ago")  # one patch per target
    add(name="fixed_in_the_future", native={"torchscript": "99.0"}, when="export")
    with onnx_compat.patched(only=["fixed_in_the_future"]):
        export(M(), (torch.randn(2, 3),), "torchscript", {0: {0: "batch"}})
    assert seen == [6, 7]  # not yet: the wrapper ran
    with pytest.raises(ValueError, match="native= takes exporters"):
        Patch(name="bad_native", targets=(), wrapper=lambda w, i, a, k: None, description="x", native={"tvm": "2.0"})


def test_an_on_import_target_is_patched_when_its_module_loads_inside_the_block(tmp_path, monkeypatch):
    """A target in a module nobody has imported is not imported to patch it; it is patched if the module
    loads while the patch is in place, and only then. Afterwards nothing of the mechanism is left."""
    (tmp_path / "onnx_compat_late_module.py").write_text("def triple(x):\n    return x * 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "onnx_compat_late_module", raising=False)
    patch = Patch(name="late_target", targets=("onnx_compat_late_module:triple",), on_import=(
        "onnx_compat_late_module:triple",), wrapper=lambda w, i, a, k: w(*a, **k) + 1, description="x", when="always")
    registry.register(patch)
    finders = list(sys.meta_path)
    try:
        with onnx_compat.patched(only=["late_target"]):
            assert "onnx_compat_late_module" not in sys.modules  # not imported to be patched
            import onnx_compat_late_module as late
            assert late.triple(2) == 7 and isinstance(late.triple, wrapt.FunctionWrapper)
            assert late.__loader__ is late.__spec__.loader and type(late.__loader__).__module__.startswith("_frozen")
        assert late.triple(2) == 6 and not isinstance(late.triple, wrapt.FunctionWrapper)
        assert sys.meta_path == finders
        with onnx_compat.patched(only=["late_target"]):  # loaded now: patched at entry like any target
            assert late.triple(2) == 7
        del sys.modules["onnx_compat_late_module"]
        with onnx_compat.patched(only=["late_target"]):
            pass
        import onnx_compat_late_module as late  # loaded after the block: untouched
        assert late.triple(2) == 6 and sys.meta_path == finders
    finally:
        registry._REGISTRY.pop("late_target")
    with pytest.raises(ValueError, match="on_import names targets it does not have"):
        Patch(name="bad_on_import", targets=(), on_import=("m:f",), wrapper=lambda w, i, a, k: None, description="x")


class _Holder:
    """A class whose attribute is a data descriptor inherited from its base, as ``Tensor.data`` is."""

    def __init__(self):
        self.stored = 1


class _Derived(_Holder):
    pass


_Holder.value = property(lambda self: self.stored, lambda self, v: setattr(self, "stored", v))


def test_an_attribute_with_a_setter_is_wrapped_at_its_getter():
    """A target that is an attribute with a setter, not a call: reading it goes through the gate (the wrapper only
    in its moment), writing it is the original's, and on exit the subclass holds no override of its own."""
    patch = Patch(name="read_plus_ten", targets=("test_registry:_Derived.value",),
                  wrapper=lambda w, i, a, k: w(*a, **k) + 10, description="x", when="always", aliases=False)
    registry.register(patch)
    try:
        held = _Derived()
        with onnx_compat.patched(only=["read_plus_ten"]):
            assert "value" in vars(_Derived) and held.value == 11
            held.value = 5
            assert held.stored == 5 and held.value == 15
        assert "value" not in vars(_Derived) and held.value == 5
    finally:
        registry._REGISTRY.pop("read_plus_ten")


def test_a_torchscript_export_does_not_load_the_dynamo_exporter():
    """The dynamo exporter's modules (dynamo, sympy: about 1 s) load only for a dynamo export; in a fresh
    process a TorchScript export of a patched model leaves them unloaded, and a dynamo export after it
    still gets the patch on its own module."""
    code = """
import sys, tempfile, os, inspect, torch, wrapt, onnx_compat
from onnx_compat import TensorSpec
seen = []
class M(torch.nn.Module):
    def forward(self, x):
        nsu = sys.modules.get("torch._export.non_strict_utils")
        seen.append(nsu and isinstance(inspect.getattr_static(nsu._NonStrictTorchFunctionHandler,
                                                              "__torch_function__"), wrapt.FunctionWrapper))
        return torch.nn.functional.conv1d(x, torch.ones(2, 2, 3), padding="same")
spec = ([TensorSpec("x", ["batch", 2, "time"])], [TensorSpec("y", ["batch", 2, "time"])])
with tempfile.TemporaryDirectory() as d:
    onnx_compat.export(M(), os.path.join(d, "t.onnx"), *spec, exporter="torchscript")
    print(sorted(m for m in ("torch._dynamo", "sympy", "torch._export.non_strict_utils") if m in sys.modules))
    onnx_compat.export(M(), os.path.join(d, "d.onnx"), *spec, exporter="dynamo")
print(any(seen))  # in the forward the dynamo exporter traces (the eager runs are outside the block)
"""
    import subprocess
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-2] == "[]", f"loaded by a TorchScript export: {lines[-2]}"
    assert lines[-1] == "True", "the dynamo exporter's torch function handler was not patched when it loaded"
