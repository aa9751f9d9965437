"""The ways to make a smaller model, each one small object with one method, built on ONNX Runtime's tools.

``make(float_path, out_path, exclude=(), calibration=None)`` writes the
approximate model of the float model at ``float_path``; ``exclude`` names
float-graph nodes to leave in float32 (automatic exclusion fills it);
``calibration`` is a ``CalibrationDataReader`` (static recipes only). The
int8 recipes are ONNX Runtime's ``quantize_dynamic`` / ``quantize_static``
with the options named and 7-bit weights (``reduce_range``, below);
float16 is ``onnxruntime.transformers.float16`` (the converter shipped in
the onnxruntime wheel), plus one step it lacks: a node CPU ONNX Runtime has
no float16 kernel for stays float32 instead of failing to load.

``op_types``: the float-graph op types the recipe quantizes (``None``: any),
the candidates automatic exclusion ranks. ``acts_on`` names the nodes of a
graph a recipe would quantize (``auto`` leaves out a recipe that quantizes none,
or the same as another).

int8 weights take 7 bits of their 8 (``reduce_range=True``) unless a recipe
says otherwise: on x86 CPUs without VNNI (AVX2 only: AMD Zen 2/3, Intel
before Cascade Lake) ONNX Runtime's int8 kernels sum pairs of uint8 x int8
products in 16 bits, which full-range weights overflow (255 * 127 * 2 >
32767). Measured on such a CPU, a ``Linear(64, 48)``'s int8-dynamic SNR
against float is 20.2 dB with full-range weights and 38.9 dB with 7-bit
ones; a static QDQ MLP 17.5 dB against 31.3 dB. The file is verified where
it is made, but runs where it is deployed: 7-bit weights compute the same
on every CPU, for about one bit of weight precision on those that would not
have saturated. A recipe object with ``reduce_range=False`` keeps 8 bits
for a fleet known to have VNNI or ARM's dot-product instructions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from ..runtimes.session import open_session
from .errors import QuantizationError


@dataclass(frozen=True)
class DynamicInt8:
    """int8 weights, activations quantized at run time (``quantize_dynamic``: MatMulInteger/ConvInteger)."""

    name: str
    op_types: Tuple[str, ...]
    per_channel: bool = False
    calibrated: bool = False
    about: str = ""
    reduce_range: bool = True  # 7-bit weights: no 16-bit overflow on x86 without VNNI (module docstring)

    def make(self, float_path: str, out_path: str, exclude: Sequence[str] = (),
             calibration: Optional[CalibrationDataReader] = None) -> None:
        quantize_dynamic(float_path, out_path, op_types_to_quantize=list(self.op_types) or None,
                         per_channel=self.per_channel, reduce_range=self.reduce_range, weight_type=QuantType.QInt8,
                         nodes_to_exclude=list(exclude))


@dataclass(frozen=True)
class StaticInt8:
    """int8 weights and activations with scales from calibration, as QuantizeLinear/DequantizeLinear pairs."""

    name: str
    per_channel: bool = False
    op_types: Optional[Tuple[str, ...]] = None
    calibrated: bool = True
    about: str = ""
    reduce_range: bool = True  # as DynamicInt8's

    def make(self, float_path: str, out_path: str, exclude: Sequence[str] = (),
             calibration: Optional[CalibrationDataReader] = None) -> None:
        if calibration is None:
            raise QuantizationError(f"{self.name} needs calibration inputs", recipe=self.name)
        quantize_static(float_path, out_path, calibration, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(self.op_types) if self.op_types else None,
                        per_channel=self.per_channel, reduce_range=self.reduce_range,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude))


_NO_KERNEL = re.compile(r"Could not find an implementation for \w+\(\d+\) node with name '([^']*)'")


@dataclass(frozen=True)
class Float16:
    """float16 weights and arithmetic; inputs and outputs stay float32 unless ``keep_io`` is False."""

    name: str
    keep_io: bool = True
    op_types: Optional[Tuple[str, ...]] = None
    calibrated: bool = False
    about: str = ""

    def make(self, float_path: str, out_path: str, exclude: Sequence[str] = (),
             calibration: Optional[CalibrationDataReader] = None) -> None:
        source = onnx.load(float_path)
        blocked = list(exclude)
        for _ in range(len(source.graph.node) + 1):
            model = convert_float_to_float16(onnx.ModelProto.FromString(source.SerializeToString()),
                                             keep_io_types=self.keep_io, node_block_list=blocked)
            missing = _node_without_fp16_kernel(model)
            if missing is None or missing in blocked:
                break
            blocked.append(missing)  # CPU ONNX Runtime runs this op in float32 only
        onnx.save(model, out_path)


def _node_without_fp16_kernel(model: onnx.ModelProto) -> Optional[str]:
    """The node ONNX Runtime (CPU) refuses to load for want of a float16 kernel, or None."""
    try:
        open_session(model, threads=1, optimization="none")
    except Exception as exc:  # NOT_IMPLEMENTED names the node; anything else is for verification to report
        found = _NO_KERNEL.search(str(exc))
        return found.group(1) if found else None
    return None


WEIGHTED = ("MatMul", "Conv", "Gemm")  # the ops with int8 kernels that hold the weights

RECIPES = (
    DynamicInt8("int8-dynamic", ("MatMul",),
                about="int8 MatMul weights, dynamic activations (icefall's and sherpa-onnx's *.int8.onnx recipe)"),
    DynamicInt8("int8-dynamic-conv", ("MatMul", "Conv"), about="int8 MatMul and Conv weights, dynamic activations"),
    DynamicInt8("int8-dynamic-per-channel", ("MatMul", "Conv"), per_channel=True,
                about="int8 MatMul and Conv weights with one scale per output channel, dynamic activations"),
    DynamicInt8("int8-dynamic-all", (), about="every op ONNX Runtime's dynamic quantizer handles (LSTM, Gather, ...)"),
    StaticInt8("int8-static", op_types=WEIGHTED,
               about="int8 MatMul/Conv/Gemm weights and their activations as QDQ, calibrated (MinMax)"),
    StaticInt8("int8-static-per-channel", per_channel=True, op_types=WEIGHTED,
               about="int8 QDQ of MatMul/Conv/Gemm, one weight scale per output channel, calibrated (MinMax)"),
    StaticInt8("int8-static-all", about="int8 QDQ of every op ONNX Runtime's static quantizer handles "
                                        "(Add, Mul, Softmax, Where, ... too), calibrated (MinMax)"),
    Float16("fp16", about="float16 weights and arithmetic, float32 inputs and outputs"),
    Float16("fp16-io", keep_io=False, about="float16 throughout, inputs and outputs too"),
)
NAMES = tuple(r.name for r in RECIPES)


def by_name(recipe) -> object:
    """The recipe called ``recipe`` (a recipe object passes through)."""
    if not isinstance(recipe, str):
        if all(hasattr(recipe, a) for a in ("name", "make", "op_types", "calibrated")):
            return recipe
        raise QuantizationError(f"recipe must be a name from {list(NAMES)} or a recipe object, got {recipe!r}")
    found = next((r for r in RECIPES if r.name == recipe), None)
    if found is None:
        raise QuantizationError(f"unknown recipe {recipe!r}; choose from {list(NAMES)}", recipe=recipe)
    return found


def handled(recipe) -> Tuple[str, ...]:
    """The op types ``recipe`` quantizes: its ``op_types``, else what ONNX Runtime's quantizer it calls handles
    when given none (dynamic: ``IntegerOpsRegistry``; static: QLinear and QDQ registries, as
    ``quantize_static`` takes them); float16 converts every op but its block list (``()`` here: any)."""
    if recipe.op_types:
        return tuple(recipe.op_types)
    if isinstance(recipe, DynamicInt8):
        return tuple(sorted(IntegerOpsRegistry))
    if isinstance(recipe, StaticInt8):
        return tuple(sorted(set(QLinearOpsRegistry) | set(QDQRegistry)))
    return ()


def acts_on(recipe, graph) -> List[str]:
    """The nodes of ``graph`` (an ``onnx.GraphProto``, top level) ``recipe`` would quantize, by op type (a
    node without a name by its op type and position)."""
    ops = handled(recipe)
    found = []
    for k, node in enumerate(graph.node):
        if (node.op_type in ops) if ops else (node.op_type not in DEFAULT_OP_BLOCK_LIST):
            found.append(node.name or f"{node.op_type}_{k}")
    return found


def maker(recipe) -> tuple:
    """What, besides the nodes, decides the model a recipe makes: two recipes with the same maker acting on
    the same nodes make the same model."""
    return (type(recipe).__name__, getattr(recipe, "per_channel", None), getattr(recipe, "keep_io", None),
            getattr(recipe, "reduce_range", None))
