"""Declared states: ``StateSpec`` and the flattening of nested state arguments.

A step takes its chunk inputs first, then one argument per item of ``states``.
An item is a ``StateSpec`` (one tensor argument) or a list/tuple of them,
nested as deep as the step wants (torchaudio's Emformer takes one
``List[List[Tensor]]``). ONNX has flat, named tensors only: ``StateLayout``
holds the mapping both ways, and the path of every state in the structure
(``"states[2][1]"``) goes into the report and the metadata.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..spec import Dim, TensorSpec
from .errors import StreamingError

OUTPUT_PREFIX = "new_"  # the naming convention: state ``cache_k`` comes back as ``new_cache_k``


@dataclass
class StateSpec:
    """One state tensor handed from a call of the step to the next.

    ``dims``: ints for fixed sizes (a cache of 64 frames), ``Dim`` for named
    ones: the batch (shared with the inputs), or a dim that grows by the chunk
    on every call (a decoder's ``past``), which starts empty (size 0).
    ``output``: the step output that carries its next value (``new_<name>``
    unless given). ``init``: the initial value, ``"zeros"`` or a number every
    element starts at (``init_states=`` of ``export_streaming`` overrides it).
    """

    name: str
    dims: Sequence[Union[Dim, int]]
    dtype: torch.dtype = torch.float32
    output: Optional[str] = None
    init: Union[str, float, int] = "zeros"

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise StreamingError(f"a StateSpec needs a non-empty name, got {self.name!r}", state=str(self.name))
        self.dims = tuple(self.dims)
        for axis, dim in enumerate(self.dims):
            if not isinstance(dim, (Dim, int)) or isinstance(dim, bool) or (isinstance(dim, int) and dim < 0):
                raise StreamingError(f"state {self.name!r} dim {axis}: expected a Dim or an int >= 0, got {dim!r}",
                                     state=self.name)
        if self.output is None:
            self.output = OUTPUT_PREFIX + self.name
        if not (self.init == "zeros" or (isinstance(self.init, (int, float)) and not isinstance(self.init, bool))):
            raise StreamingError(f"state {self.name!r}: init must be 'zeros' or a number, got {self.init!r}",
                                 state=self.name)

    def shape(self, sizes: Mapping[str, int]) -> List[int]:
        """The shape at the named sizes; a named dim without a size (a growing cache) starts empty."""
        return [d if isinstance(d, int) else int(sizes.get(d.name, 0)) for d in self.dims]

    def initial(self, sizes: Mapping[str, int]) -> torch.Tensor:
        fill = 0 if self.init == "zeros" else self.init
        return torch.full(self.shape(sizes), fill, dtype=self.dtype)

    def input_spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.dims, self.dtype)

    def describe(self) -> dict:
        return {"name": self.name, "output": self.output, "dims": [d.name if isinstance(d, Dim) else d for d in self.dims],
                "dtype": str(self.dtype).replace("torch.", "")}


Item = Union[StateSpec, Sequence["Item"]]


class StateLayout:
    """The declared state arguments, flat (ONNX order) and nested (the step's order)."""

    def __init__(self, states: Sequence[Item]) -> None:
        if isinstance(states, StateSpec) or not isinstance(states, (list, tuple)):
            states = [states]
        self.items = list(states)
        self.flat: List[StateSpec] = []
        self.paths: List[str] = []
        for k, item in enumerate(self.items):
            self._walk(item, f"state argument {k}" if isinstance(item, StateSpec) else f"states{k}")
        if not self.flat:
            raise StreamingError("a streaming step needs at least one StateSpec in states=")
        self._check_names()

    def _walk(self, item, path: str) -> None:
        if isinstance(item, StateSpec):
            self.flat.append(item)
            self.paths.append(path)
        elif isinstance(item, (list, tuple)):
            for i, sub in enumerate(item):
                self._walk(sub, f"{path}[{i}]")
        else:
            raise StreamingError(f"states: {path} is a {type(item).__name__}; expected a StateSpec or a list/tuple "
                                 "of them")

    def _check_names(self) -> None:
        names = [s.name for s in self.flat] + [s.output for s in self.flat]
        for spec in self.flat:
            if names.count(spec.name) > 1 or names.count(spec.output) > 1:
                clash = spec.name if names.count(spec.name) > 1 else spec.output
                raise StreamingError(f"state {spec.name!r}: the name {clash!r} is used more than once among the "
                                     "states and their outputs", state=spec.name)

    def __len__(self) -> int:
        return len(self.flat)

    @property
    def mapping(self) -> Dict[str, str]:
        """ONNX name -> place in the step's arguments (``"states0[1][2]"``)."""
        return dict(zip((s.name for s in self.flat), self.paths))

    def nest(self, tensors: Sequence[Optional[torch.Tensor]]) -> List:
        """The step's state arguments from flat tensors; all ``None`` (a first call): each argument is ``None``."""
        if all(t is None for t in tensors):
            return [None] * len(self.items)
        it = iter(tensors)
        return [self._fill(item, it) for item in self.items]

    def _fill(self, item, it):
        if isinstance(item, StateSpec):
            return next(it)
        return type(item)(self._fill(sub, it) for sub in item) if isinstance(item, tuple) else \
            [self._fill(sub, it) for sub in item]

    def initial(self, sizes: Mapping[str, int], init_states: Optional[Callable] = None, batch: int = 1) -> List[torch.Tensor]:
        """Flat initial states: the user's function of the batch size, else each StateSpec's own init."""
        if init_states is None:
            return [s.initial(sizes) for s in self.flat]
        values = flatten_nested(init_states(batch), "init_states(...)")
        if len(values) != len(self.flat):
            raise StreamingError(f"init_states({batch}) gave {len(values)} tensors; {len(self.flat)} states are "
                                 f"declared ({[s.name for s in self.flat]})", state=self.flat[min(len(values), len(self.flat) - 1)].name)
        for spec, value in zip(self.flat, values):
            if value.dtype != spec.dtype:
                raise StreamingError(f"init_states: state {spec.name!r} is {value.dtype}, declared {spec.dtype}",
                                     state=spec.name)
        return list(values)


def flatten_nested(value, what: str) -> List[torch.Tensor]:
    """Tensors of a nested list/tuple/dict, depth first, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flatten_nested(item, what)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in flatten_nested(item, what)]
    raise StreamingError(f"{what} holds a {type(value).__name__}; expected tensors in lists, tuples or dicts")


def input_dims(inputs: Sequence[TensorSpec]) -> Dict[str, Tuple[str, int]]:
    """Named dims of the chunk inputs: ``{dim name: (input name, axis)}``."""
    out: Dict[str, Tuple[str, int]] = {}
    for spec in inputs:
        for axis, dim in spec.dynamic_axes().items():
            out.setdefault(dim.name, (spec.name, axis))
    return out
