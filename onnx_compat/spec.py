"""What goes in and out of an exported sequence model, and example inputs for it.

The naming convention is RETURNN's: a feature tensor ``data`` ``[B, T, F]`` and,
for each dim with per-sequence lengths, an int32 ``[B]`` input
``f"{name}:size{axis}"`` (``data:size1``). The batch size is never an input:
it is the shape. Outputs follow the same rule (``output``, ``output:size1``),
and their lengths are computed by the model, not copied.
"""
from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from onnx_compat.errors import ArgumentError, SpecError


@dataclass(frozen=True)
class Dim:
    """A dynamic dim, named in the ONNX graph. ``example`` is its export size.

    ``multiple``: the size is always a multiple of this (raw audio through a
    strided feature extractor). The dynamo exporter is told so; without it,
    torch.export may guard on floor divisions it cannot prove and specialise
    the dim. Example and verification sizes are rounded up to a multiple.
    """

    name: str
    min: int = 1
    max: Optional[int] = None
    example: Optional[int] = None
    multiple: int = 1

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise SpecError(f"Dim needs a non-empty name, got {self.name!r}")
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise SpecError(f"Dim {self.name!r}: need 1 <= min <= max, got min={self.min}, max={self.max}")
        if not isinstance(self.multiple, int) or self.multiple < 1:
            raise SpecError(f"Dim {self.name!r}: multiple must be a positive int, got {self.multiple!r}")
        if self.max is not None and -(-self.min // self.multiple) * self.multiple > self.max:
            raise SpecError(f"Dim {self.name!r}: no multiple of {self.multiple} lies in [{self.min}, {self.max}]")


DimLike = Union[Dim, str, int, None]  # a str names a Dim; None: an output dim taken from what the model returns


def _checked_dim(tensor: str, axis: int, dim) -> DimLike:
    """A dim as the pipeline uses it: a name (what ``dynamic_axes`` takes) becomes its ``Dim``."""
    if isinstance(dim, str):
        return Dim(dim)
    if dim is None or isinstance(dim, Dim):
        return dim
    try:
        size = operator.index(dim)  # an int, numpy's too; not a float or a bool
    except TypeError:
        size = None
    if size is None or isinstance(dim, bool) or size < 0:
        raise SpecError(f"{tensor}: dim {axis} is {dim!r}; a dim is a Dim (or its name), a size (int >= 0), or None "
                        "for an output dim the model decides")
    return size


def size_name(name: str, axis: int) -> str:
    """ONNX name of the lengths of ``name``'s ``axis``: ``data:size1``."""
    return f"{name}:size{axis}"


@dataclass
class TensorSpec:
    """One ONNX input or output and the lengths that come with it.

    ``lengths``: axes that carry per-sequence lengths (each adds a ``[B]``
    tensor named ``name:sizeN``). For inputs, ``arg`` names the forward
    argument of the tensor and ``length_args`` those of its lengths
    (``{1: "lengths"}``); when absent, inputs are passed positionally in ONNX
    order. ``values=(low, high)``: the range example and verification inputs
    are drawn from (integers in ``[low, high)``, floats uniform in ``[low,
    high]``); by default floats are standard normal and integers in 0..9.
    Lengths are drawn as always.
    """

    name: str
    dims: Sequence[DimLike]
    dtype: torch.dtype = torch.float32
    lengths: Sequence[int] = ()
    lengths_dtype: torch.dtype = torch.int32
    arg: Optional[str] = None
    length_args: Mapping[int, str] = field(default_factory=dict)
    values: Optional[Tuple[float, float]] = None

    def __post_init__(self) -> None:
        self.dims = tuple(_checked_dim(self.name, axis, d) for axis, d in enumerate(self.dims))
        self.lengths = tuple(self.lengths)
        if self.lengths_dtype not in (torch.int32, torch.int64):
            raise SpecError(f"{self.name}: lengths_dtype must be torch.int32 or torch.int64")
        for axis in self.lengths:
            if not 0 < axis < len(self.dims):
                raise SpecError(f"{self.name}: lengths axis {axis} is not a non-batch axis of {len(self.dims)} dims")
            if not isinstance(self.dims[axis], Dim):
                raise SpecError(f"{self.name}: axis {axis} has lengths, so it must be a Dim, not {self.dims[axis]!r}")
        for axis in self.length_args:
            if axis not in self.lengths:
                raise SpecError(f"{self.name}: length_args names axis {axis}, which has no lengths")
        if self.values is not None:
            self.values = _check_values(self.name, self.values, self.dtype)

    @property
    def onnx_names(self) -> List[str]:
        """The tensor's name and then its lengths' names, in ONNX order."""
        return [self.name] + [size_name(self.name, a) for a in self.lengths]

    def dynamic_axes(self) -> Dict[int, Dim]:
        return {i: d for i, d in enumerate(self.dims) if isinstance(d, Dim)}

    def describe(self) -> dict:
        return {
            "name": self.name,
            "dims": [d.name if isinstance(d, Dim) else d for d in self.dims],
            "dtype": str(self.dtype).replace("torch.", ""),
            "lengths": {size_name(self.name, a): str(self.lengths_dtype).replace("torch.", "") for a in self.lengths},
            **({"values": list(self.values)} if self.values is not None else {}),
        }


def _check_values(name: str, values, dtype: torch.dtype) -> Tuple[float, float]:
    try:
        low, high = values
    except (TypeError, ValueError):
        raise SpecError(f"{name}: values must be a (low, high) pair, got {values!r}") from None
    if dtype == torch.bool:
        raise SpecError(f"{name}: values= does not apply to a bool tensor")
    numbers = (int, float) if dtype.is_floating_point else (int,)
    if not all(isinstance(v, numbers) and not isinstance(v, bool) for v in (low, high)):
        kind = "numbers" if dtype.is_floating_point else f"ints (the tensor is {str(dtype).replace('torch.', '')})"
        raise SpecError(f"{name}: values=({low!r}, {high!r}) must be {kind}")
    if not low < high:
        raise SpecError(f"{name}: values=({low!r}, {high!r}) needs low < high")
    return low, high


def forward_arguments(model: torch.nn.Module, inputs: Sequence[TensorSpec]) -> List[Tuple[str, Optional[str]]]:
    """``(onnx_name, forward_arg or None)`` in ONNX order; names are checked against forward."""
    params = forward_parameters(model)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    pairs: List[Tuple[str, Optional[str]]] = []
    for spec in inputs:
        pairs.append((spec.name, spec.arg))
        for axis in spec.lengths:
            pairs.append((size_name(spec.name, axis), spec.length_args.get(axis)))
    named = [arg for _, arg in pairs if arg is not None]
    if named and len(named) != len(pairs):
        unnamed = [n for n, arg in pairs if arg is None]
        raise SpecError(f"inputs {unnamed} have no forward argument: name all inputs (arg=, length_args=) or none")
    for onnx_name, arg in pairs:
        if arg is not None and arg not in params and not takes_kwargs:
            raise SpecError(f"input {onnx_name!r} maps to forward argument {arg!r}, which "
                             f"{type(model).__name__}.forward does not have (it takes {list(params)})")
    if not named:
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(pairs) > len(positional) and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            raise SpecError(f"{len(pairs)} inputs {[n for n, _ in pairs]} but {type(model).__name__}.forward "
                             f"takes {len(positional)} positional arguments {[p.name for p in positional]}")
    return pairs


def forward_parameters(model: torch.nn.Module) -> Mapping[str, inspect.Parameter]:
    """``model.forward``'s parameters. A ScriptModule's forward is a compiled method Python cannot read a
    signature from: its TorchScript schema says the same (names, and which have defaults)."""
    forward = model.forward
    if not isinstance(forward, torch._C.ScriptMethod):
        return inspect.signature(forward).parameters
    schema_args = forward.schema.arguments[1:]  # the first is ``self``
    return {a.name: inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      default=a.default_value if a.has_default_value() else inspect.Parameter.empty)
            for a in schema_args}


def dim_sizes(inputs: Sequence[TensorSpec], overrides: Mapping[str, int] = (), seed_size: int = 0) -> Dict[str, int]:
    """One size per named dim: the example export sizes (B=3, T=37 unless set)."""
    sizes: Dict[str, int] = {}
    overrides = dict(overrides)
    known = {dim.name for spec in inputs for dim in spec.dynamic_axes().values()}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ArgumentError(f"sizes: no input has a dim named {unknown[0]!r}; the inputs' dims are {sorted(known)}",
                            argument="sizes", value=unknown[0])
    for spec in inputs:
        for axis, dim in spec.dynamic_axes().items():
            if dim.name in sizes:
                continue
            default = dim.example or (3 if axis == 0 else max(37, 2 * dim.min))
            size = overrides.get(dim.name, default)
            sizes[dim.name] = _clamp(dim, size)
    return sizes


def _clamp(dim: Dim, size: int) -> int:
    size = max(size, dim.min)
    size = -(-size // dim.multiple) * dim.multiple
    if dim.max is not None and size > dim.max:
        size = dim.max // dim.multiple * dim.multiple
    return size


def make_inputs(inputs: Sequence[TensorSpec], sizes: Mapping[str, int], seed: int = 0,
                full_length: bool = True) -> Dict[str, torch.Tensor]:
    """Random inputs at ``sizes`` keyed by ONNX name; lengths differ, the longest is full.

    The batch axis (0) is shared; lengths are drawn per sequence in
    ``[max(min, T // 2), T]`` and, with ``full_length``, the first is ``T``.
    """
    gen = torch.Generator().manual_seed(seed)
    out: Dict[str, torch.Tensor] = {}
    for spec in inputs:
        shape = [sizes[d.name] if isinstance(d, Dim) else int(d) for d in spec.dims]
        if spec.dtype.is_floating_point and spec.values is not None:
            low, high = spec.values
            out[spec.name] = (low + (high - low) * torch.rand(*shape, generator=gen, dtype=torch.float64)).to(spec.dtype)
        elif spec.dtype.is_floating_point:
            out[spec.name] = torch.randn(*shape, generator=gen).to(spec.dtype)
        else:
            low, high = spec.values or (0, 10)
            out[spec.name] = torch.randint(low, high, shape, generator=gen).to(spec.dtype)
        for axis in spec.lengths:
            dim, total = spec.dims[axis], shape[axis]
            low = min(total, max(dim.min, total // 2))
            lengths = torch.randint(low, total + 1, (shape[0],), generator=gen)
            if full_length:
                lengths[0] = total
            if shape[0] > 1 and bool((lengths == lengths[0]).all()) and total > low:
                lengths[-1] = low  # lengths must differ within the batch
            out[size_name(spec.name, axis)] = lengths.to(spec.lengths_dtype)
    return out


def example_inputs(inputs: Sequence[TensorSpec], checked: Sequence[Mapping[str, torch.Tensor]],
                   sizes: Optional[Mapping[str, int]], seed: int = 0):
    """The export example: ``(named dim sizes, tensors)``, the first checked user example unless ``sizes``
    is given, else generated inputs at ``sizes`` (defaults filled in)."""
    if checked and not sizes:
        return example_sizes(inputs, checked[0]), tuple(checked[0].values())
    example = dim_sizes(inputs, sizes or {})
    return example, tuple(make_inputs(inputs, example, seed=seed).values())


def _dynamic_dims(inputs: Sequence[TensorSpec]) -> Tuple[Dict[str, Dim], set]:
    """Each named dynamic dim of the inputs (its first declaration), and the names that lead a tensor (batch)."""
    dims: Dict[str, Dim] = {}
    batch_names = set()
    for spec in inputs:
        for axis, dim in spec.dynamic_axes().items():
            dims.setdefault(dim.name, dim)
            if axis == 0:
                batch_names.add(dim.name)
    return dims, batch_names


def verification_sizes(inputs: Sequence[TensorSpec], example: Mapping[str, int], count: int = 3) -> List[Dict[str, int]]:
    """Sizes the export never saw: B=1 first, then other batch and time sizes."""
    dims, batch_names = _dynamic_dims(inputs)
    factors = [(1, 0.62), (None, 1.43), (2, 0.81), (5, 1.17)]
    out = []
    for batch, scale in factors[:max(count, 3)]:
        sizes = {}
        for name, dim in dims.items():
            if name in batch_names:
                sizes[name] = _clamp(dim, batch if batch is not None else example[name] + 1)
            else:
                sizes[name] = _clamp(dim, max(2, round(example[name] * scale)))
        out.append(sizes)
    return out


class FarSizes(dict):
    """Sizes far past the example, checked where the trace froze a size: a check the eager model may refuse
    (a table it holds only so long), which then drops it rather than failing the export."""


FAR = 4  # the far check's lengths, times the example's: where the loop lifts are checked too (issue #47)


def far_sizes(inputs: Sequence[TensorSpec], example: Mapping[str, int], known: Sequence[Mapping[str, int]] = ()
              ) -> Optional[FarSizes]:
    """B=1 and every other dynamic dim at ``FAR`` times the example (within its bounds): a size the trace froze
    (a TracerWarning) can hold near the example and fail only past it, as an FFT length rounded up from the
    example's does. None when no dim grows past the shapes already ``known``."""
    dims, batch = _dynamic_dims(inputs)
    sizes = FarSizes({name: _clamp(dim, 1 if name in batch else example[name] * FAR) for name, dim in dims.items()})
    grows = any(all(sizes[name] > k.get(name, 0) for k in known) for name in dims if name not in batch)
    return sizes if grows else None


def with_far_sizes(sizes: Optional[List[Dict[str, int]]], inputs: Sequence[TensorSpec],
                   example: Mapping[str, int]) -> List[Dict[str, int]]:
    """``sizes`` (None: the default three) and the far check, where it reaches past them."""
    sizes = sizes or verification_sizes(inputs, example)
    far = far_sizes(inputs, example, sizes)
    return sizes if far is None else sizes + [far]


def check_examples(inputs: Sequence[TensorSpec], examples) -> List[Dict[str, torch.Tensor]]:
    """User examples ``[{onnx_name: tensor}, ...]`` as tensors in ONNX order, checked against the specs.

    Names, dtypes, ranks, static sizes, dim bounds and the consistency of named
    dims (the batch of every tensor, the lengths' batch) are checked; lengths must
    fit their axis. Any problem is one ``SpecError`` naming the example, input and dim.
    """
    if examples is None:
        return []
    if isinstance(examples, Mapping) or not isinstance(examples, Sequence):
        raise SpecError("examples must be a list of {onnx_name: tensor} dicts")
    wanted = {n: (spec, None) for spec in inputs for n in [spec.name]}
    wanted.update({size_name(spec.name, a): (spec, a) for spec in inputs for a in spec.lengths})
    order = [n for spec in inputs for n in spec.onnx_names]
    checked = []
    for k, example in enumerate(examples):
        where = f"example {k}"
        if not isinstance(example, Mapping):
            raise SpecError(f"{where} is a {type(example).__name__}, not a {{onnx_name: tensor}} dict")
        missing, extra = [n for n in order if n not in example], [n for n in example if n not in wanted]
        if missing or extra:
            raise SpecError(f"{where}: " + "; ".join(
                ([f"missing input(s) {missing}"] if missing else []) + ([f"unknown input(s) {extra}"] if extra else []))
                + f" (inputs are {order})")
        tensors = {n: torch.as_tensor(example[n]) for n in order}
        sizes: Dict[str, Tuple[int, str]] = {}
        for name in order:
            spec, axis = wanted[name]
            t = tensors[name]
            dims = spec.dims if axis is None else (spec.dims[0],)
            dtype = spec.dtype if axis is None else spec.lengths_dtype
            if t.dtype != dtype:
                raise SpecError(f"{where}: input {name!r} is {str(t.dtype).replace('torch.', '')}, "
                                f"declared {str(dtype).replace('torch.', '')}")
            if t.dim() != len(dims):
                raise SpecError(f"{where}: input {name!r} has rank {t.dim()}, declared {len(dims)}")
            for i, (dim, size) in enumerate(zip(dims, t.shape)):
                label = f"{where}: input {name!r} dim {i}"
                if not isinstance(dim, Dim):
                    if size != dim:
                        raise SpecError(f"{label} is {size}, declared static {dim}")
                    continue
                if size < dim.min or (dim.max is not None and size > dim.max) or size % dim.multiple:
                    raise SpecError(f"{label} ('{dim.name}') is {size}, outside [{dim.min}, {dim.max or 'inf'}]"
                                    + (f" or not a multiple of {dim.multiple}" if dim.multiple > 1 else ""))
                seen = sizes.setdefault(dim.name, (size, name))
                if seen[0] != size:
                    raise SpecError(f"{label} ('{dim.name}') is {size}, but {seen[1]!r} has {dim.name} = {seen[0]}")
            if axis is not None and t.numel() and (int(t.min()) < 0 or int(t.max()) > tensors[spec.name].shape[axis]):
                raise SpecError(f"{where}: lengths {name!r} {t.tolist()} do not fit dim {axis} of {spec.name!r} "
                                f"(size {tensors[spec.name].shape[axis]})")
        checked.append(tensors)
    return checked


def example_sizes(inputs: Sequence[TensorSpec], example: Mapping[str, torch.Tensor]) -> Dict[str, int]:
    """The named dim sizes of one (checked) example."""
    return {dim.name: int(example[spec.name].shape[axis])
            for spec in inputs for axis, dim in spec.dynamic_axes().items()}
