"""Models that draw their own random numbers (a GAN vocoder's noise, a VAE's sample, a random message):
exported with their random nodes and verified with the eager reference run's draws fed to those nodes
(``draw_inputs.py``); a draw no ONNX node makes (randperm, multinomial) is refused naming its line.

The tests check the written graph on their own, without the pipeline's substitution: they replay each
model's draws from a seed (the same generator calls the model makes, in its order), feed them to the
graph's random nodes turned into inputs, and compare ONNX Runtime with the unpatched eager model at sizes
the export never saw, B=1 too.
"""
import operator
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper
from torch import nn

import onnx_compat
from onnx_compat import Dim, TensorSpec
from onnx_compat.errors import ExportError, RandomOutputs, VerificationError
from onnx_compat.model_state import preserved

from helpers import EXPORTERS, assert_matches

B, T = Dim("batch"), Dim("time")
COND_IN, COND_OUT = [TensorSpec("c", [B, 2, T])], [TensorSpec("y", [B, 2, T])]
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike")


class NoiseVocoder(nn.Module):
    """A GAN vocoder that draws its own noise in forward (coqui-tts' UnivNet: ``torch.randn([B, C, T])``)."""

    def __init__(self, keep_noise: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(4, 2, 3, padding=1)
        self.cond = nn.Conv1d(2, 2, 1)
        self.keep_noise = keep_noise

    def forward(self, c):
        noise = torch.randn([c.shape[0], 4, c.shape[2]])
        if self.keep_noise:  # drawn, then unused: the outputs do not depend on it
            return torch.tanh(self.cond(c))
        return torch.tanh(self.conv(noise) + self.cond(c))

    @staticmethod
    def replay(c):
        return [torch.randn([c.shape[0], 4, c.shape[2]])]


class Reparametrised(nn.Module):
    """A VAE's sample: ``mu + sigma * randn_like(mu)``."""

    def __init__(self):
        super().__init__()
        self.stats = nn.Conv1d(2, 4, 3, padding=1)

    def forward(self, c):
        mu, log_sigma = self.stats(c).chunk(2, dim=1)
        return mu + torch.exp(log_sigma) * torch.randn_like(mu)

    @staticmethod
    def replay(c):
        return [torch.randn(c.shape)]


class UniformDither(nn.Module):
    """Dither in [-1, 1): ``rand_like`` then an affine map, the way audio front ends add it."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(2, 2, 1)

    def forward(self, c):
        return self.proj(c + 0.1 * (torch.rand_like(c) * 2 - 1))

    @staticmethod
    def replay(c):
        return [torch.rand(c.shape)]


class TwoKinds(nn.Module):
    """Two draws of different kinds in one forward: normal noise, then a uniform gate."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(2, 2, 3, padding=1)

    def forward(self, c):
        noise = torch.randn_like(c)
        gate = torch.rand(c.shape[0], 1, c.shape[2])
        return self.proj(c + noise) * gate

    @staticmethod
    def replay(c):
        return [torch.randn(c.shape), torch.rand(c.shape[0], 1, c.shape[2])]


class ShiftedNormal(nn.Module):
    """``torch.normal(0.5, 2.0, size)`` and ``normal_(-1.0, 0.5)``: dynamo writes RandomNormalLike nodes with
    mean and scale; TorchScript scales a standard draw in double precision, a graph ONNX Runtime refuses to
    load (torch 2.13: "Type parameter (T) of Optype (Mul) bound to different types"), so the
    ``normal_draw_scaled`` patch scales it in float: the graph's nodes are standard, fed the draw mapped."""

    PARAMS = [(-1.0, 0.5), (0.5, 2.0)]  # in call order

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(2, 2, 1)

    def forward(self, c):
        bias = torch.empty(c.shape[0], 1, c.shape[2])
        bias.normal_(-1.0, 0.5)
        return self.proj(c) * torch.normal(0.5, 2.0, size=(c.shape[0], 2, c.shape[2])) + bias

    @staticmethod
    def replay(c):
        return [torch.empty(c.shape[0], 1, c.shape[2]).normal_(-1.0, 0.5),
                torch.normal(0.5, 2.0, size=(c.shape[0], 2, c.shape[2]))]


class UniformNoise(nn.Module):
    """``uniform_(-1, 3)`` on an empty tensor: neither exporter has ``aten::uniform``; the
    ``uniform_draw_scaled`` patch writes a standard RandomUniformLike, scaled."""

    PARAMS = [(-1.0, 3.0)]

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv1d(2, 2, 1)

    def forward(self, c):
        noise = torch.empty_like(c)
        noise.uniform_(-1.0, 3.0)
        return self.proj(c) + noise

    @staticmethod
    def replay(c):
        return [torch.empty(c.shape).uniform_(-1.0, 3.0)]


class OverwrittenNoise(nn.Module):
    """coqui-tts' UnivNet ``inference()``: draws noise, then calls ``forward``, which draws its own. The first draw
    is dead (no output depends on it) and the exporters drop it: the graph has one random node for two draws."""

    def __init__(self):
        super().__init__()
        self.vocoder = NoiseVocoder()

    def forward(self, c):
        x = torch.randn([c.shape[0], 4, c.shape[2]])  # noqa: F841 - overwritten, as in the library
        return self.vocoder(c)

    @staticmethod
    def replay(c):
        torch.randn([c.shape[0], 4, c.shape[2]])  # the dead draw, consumed from the generator as the model does
        return [torch.randn([c.shape[0], 4, c.shape[2]])]


class RandomMessage(nn.Module):
    """A watermark generator's random message when none is given (AudioSeal: ``torch.randint(0, 2, (B, nbits))``):
    both exporters write a uniform draw rounded down; the eager bits are fed as the middles of their cells."""

    PARAMS = [(0.0, 2.0)]

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 2)

    def forward(self, c):
        bits = torch.randint(0, 2, (c.shape[0], 16))
        return c + self.embed(bits.float()).unsqueeze(-1)

    @staticmethod
    def replay(c):
        return [torch.randint(0, 2, (c.shape[0], 16))]


class KeptMessage(RandomMessage):
    """AudioSeal's generator: the random message is drawn on the first call and kept on the module
    (``self.message``); each verification run starts from the model as it was, so it draws, as the graph does."""

    def __init__(self):
        super().__init__()
        self.message = torch.zeros(0)

    def forward(self, c):
        if self.message.numel() == 0:
            self.message = torch.randint(0, 2, (c.shape[0], 16))
        return c + self.embed(self.message.float()).unsqueeze(-1)


DRAWING = [NoiseVocoder, Reparametrised, UniformDither, TwoKinds, OverwrittenNoise, ShiftedNormal, UniformNoise,
           RandomMessage, KeptMessage]
NEW_SIZES = [(1, 11), (4, 29)]  # the export example is B=3, T=37 (``spec.example_inputs``)


def random_nodes(proto):
    return [n for n in proto.graph.node if n.op_type in RANDOM_OPS]


def fed_outputs(proto, model, c, seed):
    """The test's own substitution: the graph's random nodes turned into inputs fed with the model's draws
    replayed from ``seed`` (``replay``: the draws the outputs depend on, the generator consumed as the model
    does), each node given the draw of its kind and of the shape it draws at this size (unique in these
    models), which must be the model's call order; ONNX Runtime's output and the eager model's on the same
    draws."""
    torch.manual_seed(seed)
    draws = type(model).replay(c)
    torch.manual_seed(seed)
    with preserved(model), torch.no_grad():
        expected = model(c).numpy()
    params = getattr(model, "PARAMS", [(0.0, 1.0)] * len(draws))
    fed = onnx.ModelProto()
    fed.CopyFrom(proto)
    nodes = random_nodes(fed)
    signatures = [("Normal" in n.op_type, shape) for n, shape in zip(nodes, _drawn_shapes(proto, c))]
    wanted = [(kind == "normal", tuple(d.shape)) for d, kind in zip(draws, _kinds(model, len(draws)))]
    assert sorted(signatures) == sorted(wanted) and len(set(wanted)) == len(wanted), (signatures, wanted)
    order = [wanted.index(s) for s in signatures]
    assert order == sorted(order), f"the graph's random nodes are not in the model's call order: {signatures}"
    draws = [_into(node, draws[k], *params[k]) for node, k in zip(nodes, order)]
    for node in nodes:
        fed.graph.node.remove(node)
        fed.graph.input.append(helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None))
    feeds = {"c": c.numpy(), **{n.output[0]: d.float().numpy() for n, d in zip(nodes, draws)}}
    sess = ort.InferenceSession(fed.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0], expected


def _drawn_shapes(proto, c):
    """The shape each random node draws at ``c``'s size: the graph as written, its random outputs exposed."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    for node in random_nodes(probe):
        probe.graph.output.append(helper.make_empty_tensor_value_info(node.output[0]))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return [tuple(v.shape) for v in sess.run(None, {"c": c.numpy()})[len(proto.graph.output):]]


def _kinds(model, count):
    return {TwoKinds: ["normal", "uniform"], UniformDither: ["uniform"], UniformNoise: ["uniform"],
            RandomMessage: ["uniform"], KeptMessage: ["uniform"]}.get(type(model), ["normal"] * count)


def _into(node, draw, a, b):
    """The model's draw of parameters ``a``, ``b`` as the number ``node`` (of its own parameters) must draw;
    an integer draw k as the middle of the uniform numbers rounding down to it, k + 0.5."""
    if not draw.is_floating_point():
        draw = draw.double() + 0.5
    attrs = {k.name: helper.get_attribute_value(k) for k in node.attribute}
    first, second = ("mean", "scale") if "Normal" in node.op_type else ("low", "high")
    node_a, node_b = attrs.get(first, 0.0), attrs.get(second, 1.0)
    if "Normal" in node.op_type:
        return node_a + node_b * (draw - a) / b
    return node_a + (node_b - node_a) * (draw - a) / (b - a)


@pytest.mark.parametrize("exporter, model_class", [(e, m) for e in EXPORTERS for m in DRAWING],
                         ids=lambda v: getattr(v, "__name__", v))
def test_a_drawing_model_exports_with_its_random_nodes_and_is_verified_with_eager_draws(exporter, model_class,
                                                                                        tmp_path):
    model = model_class().eval()
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(model, str(path), COND_IN, COND_OUT, exporter=exporter)
    assert all(c["ok"] for c in report.verification) and len(report.verification) >= 3
    assert any(c["sizes"]["batch"] == 1 for c in report.verification)
    assert all(c["draws"] and "test_random_draws.py" in c["draws"][0] for c in report.verification)
    if model_class is OverwrittenNoise:
        assert all(c["draws"][1].startswith("unused by the outputs, no node: randn at ") and "noqa: F841" in
                   c["draws"][1] for c in report.verification)
    assert any("draws random numbers" in f and "test_random_draws.py:" in f for f in report.findings)
    proto = onnx.load(str(path))
    acted = {name for a in report.attempts if a.ok for name in a.acted}
    if model_class is UniformNoise or (model_class is ShiftedNormal and exporter == "torchscript"):
        assert acted & {"uniform_draw_scaled", "normal_draw_scaled"}, acted
    kinds = [n.op_type for n in random_nodes(proto)]
    assert len(kinds) == len(model_class.replay(torch.zeros(1, 2, 3))), kinds  # the written graph still draws
    for k, (b, t) in enumerate(NEW_SIZES):
        got, expected = fed_outputs(proto, model, torch.randn(b, 2, t), seed=100 + k)
        assert got.shape == expected.shape == (b, 2, t)
        assert np.std(expected) > 1e-3, "degenerate reference"
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3, err_msg=f"at B={b} T={t}")
    # the graph as written draws anew at each run
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    c = np.random.default_rng(0).standard_normal((3, 2, 13)).astype(np.float32)  # 48 random bits differ surely
    assert not np.allclose(sess.run(None, {"c": c})[0], sess.run(None, {"c": c})[0])


def test_auto_exports_a_drawing_model_and_public_verify_takes_its_draws(tmp_path):
    model, path = TwoKinds().eval(), tmp_path / "m.onnx"
    report = onnx_compat.export(model, str(path), COND_IN, COND_OUT)
    assert all(c["ok"] for c in report.verification)
    checks = onnx_compat.verify(str(path), model, COND_IN, COND_OUT, example={"batch": 2, "time": 20})
    assert all(c.ok for c in checks) and [len(c.draws) for c in checks] == [2] * len(checks)


class FrozenNoise(nn.Module):
    """The draw's shape read as Python ints (``operator.index``; ``int()`` of a size is kept in the graph): TorchScript freezes the example's shape into its random node."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 2, 3, padding=1)

    def forward(self, c):
        return self.conv(torch.randn(operator.index(c.shape[0]), 4, operator.index(c.shape[2]))) + c


def test_a_draw_frozen_at_the_example_shape_is_refused_naming_the_draw(tmp_path):
    with pytest.raises(ExportError, match=r"random node 1 \(RandomNormal.*draws shape \[3, 4, 37\] but the model "
                                          r"drew \[1, 4, 23\] \(randn at .*test_random_draws.py:\d+"):
        onnx_compat.export(FrozenNoise().eval(), str(tmp_path / "m.onnx"), COND_IN, COND_OUT,
                           exporter="torchscript")
    assert not os.listdir(tmp_path)


def _exported(model, exporter, tmp_path):
    path = tmp_path / f"{exporter}.onnx"
    onnx_compat.export(model, str(path), COND_IN, COND_OUT, exporter=exporter)
    return onnx.load(str(path))


def _verify(proto, model):
    return onnx_compat.verify(proto, model, COND_IN, COND_OUT, example={"batch": 2, "time": 20})


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_feeding_the_draws_does_not_make_verification_vacuous(exporter, tmp_path):
    """A graph wrong after its draw (the Add of noise and condition turned into a Sub) fails verification."""
    model = NoiseVocoder().eval()
    proto = _exported(model, exporter, tmp_path)
    assert all(c.ok for c in _verify(proto, model))  # as exported: verified
    add = next(n for n in proto.graph.node if n.op_type == "Add")
    add.op_type = "Sub"
    with pytest.raises(VerificationError, match=r"at sizes \{'batch': 1, 'time': \d+\}: output 'y' max abs err"):
        _verify(proto, model)


def _with_params(node, mean: float, scale: float) -> None:
    kept = [a for a in node.attribute if a.name not in ("mean", "scale")]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("mean", mean), helper.make_attribute("scale", scale)])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_node_of_other_parameters_is_fed_the_draw_mapped_into_its_own_distribution(exporter, tmp_path):
    """``normal_(-1, 0.5)`` and ``torch.normal(0.5, 2.0, size)``: TorchScript's (patched) graph draws standard
    numbers and scales them itself, dynamo's nodes carry mean and scale; both verify (the eager draw d of
    N(0.5, 2) is fed to a standard node as (d - 0.5) / 2). Nodes given other parameters (mean 3 and scale 5:
    scaled twice; a dynamo node made standard: never scaled) fail, as the value fed is always the number the
    node must draw for the graph to compute what eager did."""
    model = ShiftedNormal().eval()
    proto = _exported(model, exporter, tmp_path)
    assert all(c.ok for c in _verify(proto, model))
    for mean, scale in [(3.0, 5.0)] + [(0.0, 1.0)] * (exporter == "dynamo"):
        wrong = onnx.ModelProto()
        wrong.CopyFrom(proto)
        for node in random_nodes(wrong):
            _with_params(node, mean, scale)
        with pytest.raises(VerificationError, match=r"output 'y' max abs err"):
            _verify(wrong, model)


class SignedSteps(nn.Module):
    """``randint_like(c, -3, 4)``: TorchScript writes a uniform draw in [-3, 4) cast to integers, which truncates
    toward zero (-0.5 gives 0, never -3): a wrong distribution. Fed the middles of eager's cells, its graph
    fails; dynamo's rounds down and verifies."""

    def forward(self, c):
        return c * torch.randint_like(c, -3, 4)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_an_integer_draw_is_fed_so_that_the_graph_rounding_is_checked(exporter, tmp_path):
    path = tmp_path / "m.onnx"
    if exporter == "torchscript":
        with pytest.raises(ExportError, match=r"torchscript export failed: VerificationError: .*output 'y' max abs"):
            onnx_compat.export(SignedSteps().eval(), str(path), COND_IN, COND_OUT, exporter=exporter)
        assert not os.listdir(tmp_path)
        return
    report = onnx_compat.export(SignedSteps().eval(), str(path), COND_IN, COND_OUT, exporter=exporter)
    assert all(c["ok"] and "randint_like at " in c["draws"][0] for c in report.verification)


def test_a_graph_without_the_draw_is_refused_saying_so(tmp_path):
    """A graph whose random node became a constant (what an export that freezes a draw writes) fails, and the
    error says the model draws and the graph holds no random node."""
    model = NoiseVocoder().eval()
    proto = _exported(model, "torchscript", tmp_path)
    node = random_nodes(proto)[0]
    node.op_type = "Identity"
    del node.attribute[:]
    with pytest.raises(VerificationError, match=r"max abs err .* \[the model draws random numbers \(randn at "
                                                r".*test_random_draws.py:\d+ .*\) and the graph holds no random "
                                                r"node: a draw the outputs depend on was frozen"):
        _verify(proto, model)


def test_a_random_node_of_another_kind_is_refused_naming_both(tmp_path):
    model = NoiseVocoder().eval()
    proto = _exported(model, "torchscript", tmp_path)
    node = random_nodes(proto)[0]
    node.op_type = "RandomUniformLike"
    del node.attribute[:]
    with pytest.raises(VerificationError, match=r"draw 1 of the model \(randn at .*test_random_draws.py:\d+.*\) is "
                                                r"normal but the graph's random node 1 .* draws uniform numbers"):
        _verify(proto, model)


def test_a_graph_that_lost_its_draw_is_refused_by_count(tmp_path):
    """A graph with one random node fewer than the model draws (TwoKinds' gate made a constant one)."""
    model = TwoKinds().eval()
    proto = _exported(model, "torchscript", tmp_path)
    gate = random_nodes(proto)[1]
    gate.op_type, gate.domain = "ConstantOfShape", ""
    del gate.attribute[:]
    gate.attribute.append(helper.make_attribute("value", helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.0])))
    shape = helper.make_node("Shape", [gate.input[0]], [gate.input[0] + "_shape"])
    gate.input[0] = shape.output[0]
    proto.graph.node.insert(list(proto.graph.node).index(gate), shape)
    with pytest.raises(VerificationError, match=r"the model drew 2 times \(randn_like at .*; rand at .*\) but the "
                                                r"graph has 1 random nodes"):
        _verify(proto, model)


class Shuffled(nn.Module):
    """Draws no ONNX random node makes: a permutation, a categorical sample."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.proj = nn.Conv1d(2, 2, 1)

    def forward(self, c):
        if self.how == "randperm":
            return self.proj(c)[:, :, torch.randperm(c.shape[2])]
        picks = torch.multinomial(torch.softmax(c[0], dim=0).T, 1)  # (T, 1)
        return self.proj(c) * picks.T.unsqueeze(0).to(c.dtype)


@pytest.mark.parametrize("how", ["randperm", "multinomial"])
@pytest.mark.parametrize("exporter", EXPORTERS + ["auto"])
def test_a_draw_no_onnx_node_makes_keeps_the_refusal_naming_its_line(exporter, how, tmp_path):
    with pytest.raises(RandomOutputs, match=rf"outputs \['y'\] change from one call to the next.*{how} at "
                                            rf".*test_random_draws.py:\d+ `.*torch.{how}.*no ONNX random node"):
        onnx_compat.export(Shuffled(how).eval(), str(tmp_path / "m.onnx"), COND_IN, COND_OUT, exporter=exporter)
    assert not os.listdir(tmp_path)


def test_a_draw_the_outputs_do_not_depend_on_is_no_refusal(tmp_path):
    model = NoiseVocoder(keep_noise=True).eval()
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(model, str(path), COND_IN, COND_OUT)
    assert all(c["ok"] and not c["draws"] for c in report.verification)
    assert_matches(onnx.load(str(path)), model, torch.randn(1, 2, 7))


def test_a_random_model_exports_unproven_with_verify_false(tmp_path):
    path = tmp_path / "m.onnx"
    report = onnx_compat.export(Shuffled("multinomial").eval(), str(path), COND_IN, COND_OUT,
                                exporter="torchscript", verify=False)
    assert path.exists() and report.verification == []


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_draws_with_parameters_fail_a_plain_export(exporter):
    """What the ``normal_draw_scaled`` and ``uniform_draw_scaled`` patches remove: neither exporter has
    ``aten::uniform``; TorchScript draws ``normal_``/``torch.normal`` in double precision and returns a double
    output where eager's is float32 (or, when the draw meets a float tensor, a graph ONNX Runtime does not load:
    "Type parameter (T) of Optype (Mul) bound to different types")."""
    from helpers import export
    from onnx_compat.testing import assert_fails_as_recorded
    dynamic = {0: {0: "batch", 2: "time"}}
    assert_fails_as_recorded(lambda: export(UniformNoise().eval(), (torch.randn(3, 2, 37),), exporter, dynamic),
                             ("aten::uniform", "uniform"))
    if exporter == "torchscript":
        proto = export(ShiftedNormal().eval(), (torch.randn(3, 2, 37),), exporter, dynamic)
        assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE  # eager: float32


def test_a_plain_export_of_a_noise_drawing_model_is_never_checked():
    """The vanilla situation: ``torch.onnx.export`` writes the graph with its random node and nothing verifies it;
    compared with eager as any model is, it differs at every size (the sweep read that as an exporter's wrong
    numbers: 0.049 on coqui-tts' UnivNet)."""
    from helpers import export
    from onnx_compat.testing import assert_fails_as_recorded
    model = NoiseVocoder().eval()
    proto = export(model, (torch.randn(3, 2, 37),), "torchscript", {0: {0: "batch", 2: "time"}})
    assert [n.op_type for n in random_nodes(proto)] == ["RandomNormalLike"]
    assert_fails_as_recorded(lambda: assert_matches(proto, model, torch.randn(1, 2, 23)), "mismatch: ")
