"""The longest of a declared lengths input read as the padded dim, while an export traces.

Models size a padding mask, or check the input, with the longest length read
back as a Python number: ``lengths.max().item()``, ``max(lengths)``,
``max(lengths.tolist())`` (measured on torch 2.13 with a mask
``arange(n)[None] < lengths[:, None]`` applied to the padded input). The
TorchScript exporter bakes the example's longest length (ONNX Runtime then
fails to broadcast "23 by 37" at another length); under dynamo
``max(lengths)`` and ``lengths.tolist()`` loop over the batch, which is then
specialised ("Got invalid dimensions for input").

A lengths input declared for a dim (``TensorSpec(lengths=[axis])``, ONNX
name ``data:size1``) means by convention that the padded dim is the longest
length: every padded batch is as long as its longest sequence. While an
export traces, the maximum of such an input (``max()``/``amax()`` without a
dim, builtin ``max`` over it or over its ``tolist()``) is therefore read as the
padded dim itself: a traced size under TorchScript, the dim's symbol under
dynamo. The graph is right at every input that keeps the convention, which
is how the pipeline verifies (the longest length of each batch fills it).

``declare`` says which input holds the lengths of which dim; ``export()``'s
adapter declares every lengths input of the specs. The example traced must
keep the convention: under TorchScript an example whose longest length is
shorter than the padded dim is refused, naming the line that read it. A
``lengths.tolist()`` read otherwise gives a ``LengthsList`` that keeps its tensor
(espnet's and funasr's ``make_pad_mask``): its ``len()``, builtin ``max()`` and
``Tensor.new``/``torch.tensor``/``torch.as_tensor`` of it stay dynamic; any other
use (an item, a Python loop: a list as long as a dynamic batch) is refused under
dynamo, naming the line. ``int()`` of the maximum must return a
Python int: under TorchScript the model's ``int`` calls are pointed at one that
keeps the traced size while it traces (``int_calls.py``); under dynamo torch's
own strict retry keeps ``int(lengths.max())`` symbolic.

Lengths computed from a declared input keep the convention when the function keeps the maximum (frame
lengths ``(lengths - k) // s + 1``, ``ceil(lengths / s)``, casts): all the reads above of such lengths give
that function of the padded dim, which a mode follows them for while the model runs
(``_derived_lengths.py``). Lengths computed by a function that does not (``T - lengths``) are refused when
read back as a list, naming the line that read them and the line that computed them.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Dict, List, Mapping, Sequence, Tuple

import torch

from onnx_compat.errors import SpecError
from onnx_compat.patches.registry import Patch, register
from .loops import _listed, called_name
from .arithmetic import reduce_all, single_tensor_extreme
from .recurrent import _refuse
from .when import any_exporting, dynamo_exporting, torchscript_exporting
from ._derived_lengths import Derived, Follow
from ._warning_site import model_frame, model_frame_outside_torch, said_at

class Declared:
    """A lengths input declared for dim ``axis`` of ``padded`` (its ONNX name ``name``)."""

    def __init__(self, tensor: torch.Tensor, padded: torch.Tensor, axis: int, name: str):
        self.ref, self.padded_ref, self.axis, self.name = weakref.ref(tensor), weakref.ref(padded), axis, name

    def size(self, lengths: torch.Tensor, frame):
        """The padded dim as the exporter traces it: a 0-d tensor from the traced shape (TorchScript), the
        dim's symbol (dynamo)."""
        padded = self.padded_ref()
        if torchscript_exporting():
            longest, size = _example_max(lengths), int(padded.shape[self.axis])
            if longest != size:
                raise SpecError(f"{_where(frame)}: reads the longest of lengths {self.name!r} as the padded dim "
                                f"{self.axis} (a declared lengths input means the padded dim is the longest length), "
                                f"but the example's longest length is {longest}, shorter than the padded {size}: a "
                                f"model that needs its longest sequence shorter than the padding cannot be exported "
                                f"this way")
            return torch._shape_as_tensor(padded)[self.axis]
        return padded.shape[self.axis]


# id(tensor) -> its declaration
_declared: Dict[int, Declared] = {}
# id(a maximum read as the padded size) -> (that tensor, the size: a traced 0-d tensor or a SymInt)
_padded: Dict[int, Tuple[weakref.ref, object]] = {}
# the mode that follows declared lengths through the functions that keep their maximum (_derived_lengths.py)
_follow: List[Follow] = []


def wanted() -> bool:
    """Declarations matter only while an export runs our Python (not inside dynamo's bytecode tracing,
    whose strict retry sees no Python-level state)."""
    compiling = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", None)  # is_compiling: export too
    return not (compiling is not None and compiling()) and any_exporting()


def declare(tensors: Sequence[torch.Tensor], lengths: Mapping[int, Tuple[int, int, str]]) -> list:
    """``tensors[i]`` holds the lengths of dim ``axis`` of ``tensors[j]`` for each ``i: (j, axis, name)``;
    returns the keys to hand to ``forget`` once the model has run."""
    keys = []
    for i, (j, axis, name) in lengths.items():
        lengths_tensor, padded = tensors[i], tensors[j]
        if isinstance(lengths_tensor, torch.Tensor) and isinstance(padded, torch.Tensor):
            _declared[id(lengths_tensor)] = Declared(lengths_tensor, padded, axis, name)
            keys.append(id(lengths_tensor))
    return keys


@contextlib.contextmanager
def declared(tensors: Sequence[torch.Tensor], lengths: Mapping[int, Tuple[int, int, str]]):
    """While the block runs the model on ``tensors``, their lengths are declared (``declare``) when an export
    traces, and followed through the functions that keep their maximum; otherwise nothing happens."""
    keys = declare(tensors, lengths) if lengths and wanted() else []
    mode = Follow(_entry, torchscript_exporting(), padded_size_of) if keys and not _follow else None
    try:
        if mode is None:
            yield
        else:
            _follow.append(mode)
            with mode:
                yield
    finally:
        if mode is not None:
            _follow.remove(mode)
        forget(keys)


def forget(keys) -> None:
    if not keys:
        return
    for key in keys:
        _declared.pop(key, None)
    _padded.clear()
    _batch.clear()


@contextlib.contextmanager
def _untracked():
    """Reads of the example's own values (for a check) that no patch or follower sees."""
    global _paused
    paused, _paused = _paused, True
    for mode in _follow:
        mode.paused = True
    try:
        yield
    finally:
        _paused = paused
        for mode in _follow:
            mode.paused = paused


_paused = False


def _example_max(tensor: torch.Tensor) -> int:
    with _untracked(), warnings.catch_warnings():  # the example's own numbers, read for this check only
        warnings.simplefilter("ignore")
        return int(tensor.detach().max())


def _entry(tensor):
    """The declaration of a lengths input, or the record of lengths derived from one (``Derived``)."""
    if _paused or not isinstance(tensor, torch.Tensor):
        return None
    derived = _follow[0].find(tensor) if _follow else None
    if derived is not None or _broken(tensor) is not None:  # an in-place op may have made it either
        return derived
    hit = _declared.get(id(tensor))
    return hit if hit is not None and hit.ref() is tensor else None


def _broken(tensor):
    return _follow[0].find_broken(tensor) if _follow and isinstance(tensor, torch.Tensor) else None


def _where(frame) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "the model"


def _padded_size(entry, lengths: torch.Tensor, frame):
    """The longest of ``lengths`` as the exporter traces it: the padded dim, or the function of it that
    derived lengths were computed by."""
    if isinstance(entry, Derived):
        return entry.size(lengths, frame, torchscript_exporting(), _example_max)
    return entry.size(lengths, frame)


def _maximum(entry, lengths, frame):
    """The maximum read as the padded size, a 0-d tensor of the lengths' dtype made from the traced size,
    remembered with that size for ``item()``/``tolist()``."""
    size = _padded_size(entry, lengths, frame)
    if isinstance(size, torch.Tensor):
        out = size.to(lengths.dtype)
    else:  # from the dim's symbol: the graph holds the padded size (amax without dims does not convert)
        out = torch.full((), size, dtype=lengths.dtype, device=lengths.device)
    _padded[id(out)] = (weakref.ref(out), size)
    return out


def _reduction(wrapped, instance, args, kwargs):
    """``lengths.max()``, ``torch.max(lengths)``, ``amax`` of the whole tensor."""
    lengths = instance if instance is not None else (args[0] if args else None)
    rest = args if instance is not None else args[1:]
    entry = _entry(lengths)
    if entry is None or rest or kwargs:
        return _other_tensor(wrapped, instance, args, kwargs)
    frame = model_frame()
    return _maximum(entry, lengths, frame)


def _next_call_is_max(frame) -> bool:
    """``max(lengths.tolist())``: the call after this one (the frame is at ``tolist``'s) is ``max``."""
    later = [i.offset for i in _listed(frame.f_code) if i.offset > frame.f_lasti and i.opname == "CALL"]
    return bool(later) and called_name(frame.f_code, later[0]) == "max"


class LengthsList(list):
    """``lengths.tolist()`` of a declared lengths input while exporting: a list that keeps its tensor.

    The speech toolkits' ``make_pad_mask`` reads the lengths as a list, the batch as its ``len()``, the longest
    as ``max()`` of it, and makes the tensor back with ``Tensor.new(list)``. Those four stay dynamic: ``len``
    and ``max`` of it (the model's calls, pointed at ``len_of``/``max_of`` by ``int_calls``) give the traced
    batch and the padded dim, ``Tensor.new``/``torch.tensor``/``torch.as_tensor`` of it give the lengths tensor
    back. Under TorchScript it holds the example's values, so any other use behaves as a list (and bakes, as
    before); under dynamo it has no values: any other use is refused, naming its line."""

    def __init__(self, values, tensor, entry, where):
        super().__init__(values)
        self.tensor, self.entry, self.where = tensor, entry, where

    def _refused(self):
        _refuse(f"{_where(model_frame_outside_torch())}: uses lengths.tolist() (read at {self.where}) of the lengths "
                f"input {self.entry.name!r} item by item: one number per sequence of the batch, a Python list as long "
                f"as the dynamic batch. Read the longest as lengths.max() (the padded dim), the batch as "
                f"len(...) of it, or write it with tensor ops over the lengths")

    def __len__(self):
        return super().__len__() if torchscript_exporting() or not dynamo_exporting() else self._refused()

    def __iter__(self):
        return super().__iter__() if torchscript_exporting() or not dynamo_exporting() else self._refused()

    def __getitem__(self, key):
        return super().__getitem__(key) if torchscript_exporting() or not dynamo_exporting() else self._refused()


def _tolist(wrapped, instance, args, kwargs):
    entry = _entry(instance)
    frame = model_frame()
    if frame is not None and not args and not kwargs and _next_call_is_max(frame):
        return [_padded_size(entry, instance, frame)]
    if args or kwargs:
        return said_at(frame, wrapped, *args, **kwargs)
    values = [] if dynamo_exporting() else said_at(frame, wrapped)
    return LengthsList(values, instance, entry, _where(frame))


_batch: list = []  # the traced batch sizes len_of handed out (int_of keeps them)


def len_of(value):
    """``len()`` of a declared lengths input's ``tolist()``, or of any tensor while exporting: the traced size of
    its first dim (a 0-d tensor under TorchScript, the dim's symbol under dynamo), as ``x.shape[0]`` gives it.
    Python's ``len()`` must return an int, so ``b = len(x)`` froze the batch under TorchScript and specialised it
    under dynamo (issue #47, 4)."""
    if isinstance(value, LengthsList):
        tensor = value.tensor
    elif isinstance(value, torch.Tensor) and id(value) in _weights:
        with warnings.catch_warnings():  # a size the model fixes: the tracer's "Using len" warning is no baked size
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return len(value)
    elif isinstance(value, torch.Tensor) and value.dim() > 0 and any_exporting():
        tensor = value
    else:
        return len(value)
    size = torch._shape_as_tensor(tensor)[0] if torchscript_exporting() else tensor.shape[0]
    _batch.append(size)
    _substituted()
    return size


_substitutions = 0  # len/max/min calls a stand-in answered (``int_calls`` reads it for ``patch.idle``)


def _substituted() -> None:
    global _substitutions
    _substitutions += 1


def substitutions() -> int:
    """How many ``len``/``max``/``min`` calls a stand-in has answered so far (``int_calls``: was the patch idle)."""
    return _substitutions


def max_of(*args, **kwargs):
    """Builtin ``max`` over a declared lengths input's ``tolist()``: the padded dim (as ``max(lengths)``). Builtin
    ``max`` over one real tensor of one dim while exporting is its ``max()`` (the same number; with a NaN,
    torch's, which is NaN, where Python's depends on where the NaN stands): Python's ``max`` iterates the tensor,
    which unrolls its dim under TorchScript and specialises it under dynamo; its ``max()`` is a reduction in the
    graph, and the padded dim for a declared lengths input."""
    if len(args) == 1 and not kwargs and isinstance(args[0], LengthsList):
        return _maximum(args[0].entry, args[0].tensor, model_frame())
    entry = _entry(args[0]) if len(args) == 1 and not kwargs else None
    if entry is not None:  # max(lengths) itself, as ``_iter`` reads it
        return _maximum(entry, args[0], model_frame())
    if _reducible(args, kwargs):
        _substituted()
        return args[0].max()
    return max(*args, **kwargs)


def min_of(*args, **kwargs):
    """Builtin ``min`` over one real tensor of one dim while exporting: its ``min()``, as ``max_of``."""
    if _reducible(args, kwargs):
        _substituted()
        return args[0].min()
    return min(*args, **kwargs)


def _reducible(args, kwargs) -> bool:
    value = args[0] if len(args) == 1 and not kwargs else None
    return (isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_complex()
            and value.dtype != torch.bool and any_exporting())


_weights: set = set()  # ids of the traced model's parameters and buffers: their len() stays a Python int


def weights_of(root) -> None:
    """The model about to be traced: ``len()`` of its parameters and buffers (sizes fixed by the model, such as
    ``range(len(self.kernels))``) stays the int it was; only computed tensors' first dims are traced sizes."""
    _weights.clear()
    if isinstance(root, torch.nn.Module):
        _weights.update(id(t) for t in root.parameters())
        _weights.update(id(t) for t in root.buffers())


def forget_batch() -> None:
    """The sizes ``len_of`` handed out during one trace, dropped when it ends (and the weights' ids)."""
    _batch.clear()
    _weights.clear()


def kept_size(value):
    """``int()`` of a batch size ``len_of`` gave stays that size; None for any other value."""
    return value if any(size is value for size in _batch) else None


def as_lengths(wrapped, instance, args, kwargs):
    """``Tensor.new(l)``, ``torch.tensor(l)``, ``torch.as_tensor(l)`` of a ``LengthsList``: the lengths tensor
    itself in the dtype asked for (a list of ints makes int64; ``new`` takes the instance's dtype)."""
    if not args or not isinstance(args[0], LengthsList) or len(args) > 1:
        return None
    dtype = kwargs.get("dtype") or (instance.dtype if instance is not None else torch.int64)
    device = kwargs.get("device") or (instance.device if instance is not None else args[0].tensor.device)
    return args[0].tensor.to(device=device, dtype=dtype)


def _iter(wrapped, instance, args, kwargs):
    """``max(lengths)`` iterates the lengths: the one item it then gets is the padded size."""
    entry = _entry(instance)
    frame = model_frame() if entry is not None else None
    if frame is not None and called_name(frame.f_code, frame.f_lasti) == "max":
        return iter([_maximum(entry, instance, frame)])
    return said_at(model_frame(), wrapped, *args, **kwargs)


def read(wrapped, instance, args, kwargs):
    """``item()``/``tolist()`` (constant_values' targets) of a declared lengths input or of its maximum read as
    the padded size; None when neither (the caller goes on as before)."""
    if not _declared or wrapped.__name__ not in ("item", "tolist", "tensor", "as_tensor"):
        return None
    if wrapped.__name__ in ("tensor", "as_tensor"):
        return as_lengths(wrapped, instance, args, kwargs)
    if wrapped.__name__ == "tolist" and _entry(instance) is not None:
        return _tolist(wrapped, instance, args, kwargs)
    if wrapped.__name__ == "tolist" and _broken(instance) is not None:
        _refuse_read(_broken(instance), "lengths.tolist()")
    hit = _padded.get(id(instance))
    if hit is None or hit[0]() is not instance or args or kwargs:
        return None
    return hit[1]


def _refuse_read(broken, read: str):
    """Lengths computed by a function that does not keep their maximum, read back as numbers: the graph would
    hold the example's (TorchScript) or a batch as long as the example's (dynamo)."""
    _refuse(broken.refusal(read, _where(model_frame())))


def padded_size_of(tensor: torch.Tensor):
    """The padded size a maximum read as the padded dim stands for (``int_calls``: ``int()`` of it), also when
    handed that size itself (``int(lengths.max().item())``); None for any other tensor."""
    hit = _padded.get(id(tensor))
    if hit is not None and hit[0]() is tensor:
        return hit[1]
    return tensor if any(size is tensor for _, size in _padded.values()) else None


def _other_tensor(wrapped, instance, args, kwargs):
    """A call on a tensor that is no lengths input: as it is, but ``amax()`` with no dim, which the dynamo exporter
    cannot translate, has its dims named (``arithmetic.reduce_all``), and ``torch.maximum(t)``, the non-strict
    capture's ``max(t)``, is the largest element (``arithmetic.single_tensor_extreme``): this patch owns the
    ``amax`` and ``maximum`` targets."""
    if wrapped.__name__ == "amax" and dynamo_exporting():
        return reduce_all(wrapped, instance, args, kwargs)
    if wrapped.__name__ == "maximum" and dynamo_exporting():
        return single_tensor_extreme(wrapped, instance, args, kwargs)
    return wrapped(*args, **kwargs)


def _padded_lengths(wrapped, instance, args, kwargs):
    if not _declared:
        return _other_tensor(wrapped, instance, args, kwargs) if wrapped.__name__ != "__iter__" else \
            said_at(model_frame(), wrapped, *args, **kwargs)
    name = wrapped.__name__
    if name == "new":
        made = as_lengths(wrapped, instance, args, kwargs)
        return wrapped(*args, **kwargs) if made is None else made
    if name in ("max", "amax"):
        return _reduction(wrapped, instance, args, kwargs)
    if name == "maximum":  # the non-strict exporter turns builtin max(tensor) into torch.maximum(tensor)
        entry = _entry(args[0]) if len(args) == 1 and not kwargs else None
        return _other_tensor(wrapped, instance, args, kwargs) if entry is None else \
            _maximum(entry, args[0], model_frame())
    return _iter(wrapped, instance, args, kwargs)


register(Patch(
    name="padded_lengths",
    description="the longest of a declared lengths input (lengths.max().item(), max(lengths), "
                "max(lengths.tolist())) is read as the padded dim while exporting, not the example's number; "
                "amax() of any other tensor with no dim has its dims named under dynamo (amax_amin_all's rule), "
                "max(t) of any other 1-D tensor is its largest element (builtin_max_min's rule)",
    # item() and tolist() are constant_values' targets, which hands them to ``read`` first
    targets=("torch:max", "torch:amax", "torch:Tensor.max", "torch:Tensor.amax", "torch:Tensor.__iter__",
             "torch:maximum", "torch:Tensor.new"),
    requires=("constant_values",),
    wrapper=_padded_lengths,
    when="export",
    aliases=False,
))
