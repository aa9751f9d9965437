"""Recurrent layers under the dynamo exporter: LSTM/GRU with a dynamic time dim, packed sequences.

torch.export traces ``nn.LSTM``/``nn.GRU`` through their composite
implementation, one step per frame of the example: the time length is baked
(time-first RNNs fail at any other T, batch-first ones bake T into any later
shape use) and a second RNN export in the same process fails ("inferred a
static shape"). ``pack_padded_sequence`` does not trace at all ("zeros(): ...
got FakeTensor").

``rnn_dynamic_time`` routes both modules through one ``torch.library`` custom
op whose fake implementation keeps T symbolic; ``patched()`` hands
``torch.onnx.export`` a translation of that op to ONNX ``LSTM``/``GRU`` nodes
(``onnx_translations``). ``packed_sequences`` turns ``pack_padded_sequence`` ->
RNN -> ``pad_packed_sequence`` into the padded tensor plus lengths while
exporting; ONNX's ``sequence_lens`` then gives what packing gives: outputs at
valid frames, zeros at padded frames, the backward direction starting at each
sequence's own end, and ``h_n`` *and* ``c_n`` taken at each sequence's last
valid frame. ``pad_packed_sequence`` without ``total_length`` returns the
input's T (PyTorch returns max(lengths); the two agree when the longest
sequence fills the batch, as RASR feeds it). Unpacking masks the padded frames (a packing unpacked with no
RNN in between kept the input's).

Under TorchScript, which writes one pack -> RNN -> unpack pair itself, ``packed_sequences`` gives each RNN
a pair of its own around it (``_paired``), so packing used otherwise exports: a model reading only the
final state (the unused unpacking was dropped, and the lone packing failed: "vector::_M_range_check"),
several RNNs on one packing, a packing unpacked as it is (issue #47, 6). A ``PackedSequence`` rebuilt by
hand from ``packed.data`` is refused naming the line. The stand-in (``Padded``) is a ``PackedSequence``, so code
that packs only what is not packed yet (stanza's PackedLSTM) passes it on as it is; packing it again is refused
as PyTorch refuses to pack a packing.

``LSTM(proj_size>0)`` has no ONNX ``LSTM`` equivalent; under either exporter
it runs as a loop over time (``_lstm_projection``: ONNX ``Scan`` from dynamo,
``Loop`` from TorchScript). Plain LSTM/GRU are left to the TorchScript
exporter, which writes them right.

Unsupported, with an error at export time: unbatched (2-D) input.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from onnx_compat import versions
from onnx_compat.errors import UnsupportedPattern

from onnx_compat.patches import when

from onnx_compat.patches.registry import Patch, register
from onnx_compat.patches._lstm_projection import lstm_projected

_MODES = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru}


def _run_eager(x, lengths, hx, params, mode, num_layers, bidirectional, batch_first, has_biases):
    fn = _MODES[mode]
    state = hx if mode == "LSTM" else hx[0]
    if lengths is None:
        y, *states = fn(x, state, params, has_biases, num_layers, 0.0, False, bidirectional, batch_first)
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu().long(), batch_first=batch_first,
                                                         enforce_sorted=False)
        order = packed.sorted_indices
        state = [h.index_select(1, order) for h in hx] if mode == "LSTM" else state.index_select(1, order)
        data, *states = fn(packed.data, packed.batch_sizes, state, params, has_biases, num_layers, 0.0, False,
                           bidirectional)
        out = PackedSequence(data, packed.batch_sizes, order, packed.unsorted_indices)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first, total_length=x.shape[int(batch_first)])
        states = [s.index_select(1, packed.unsorted_indices) for s in states]
    h = states[0]
    c = states[1] if mode == "LSTM" else h.clone()
    return y, h, c


def _fake(x, hx, params, bidirectional):
    hidden = hx[0].shape[-1]
    y = x.new_empty(x.shape[0], x.shape[1], (2 if bidirectional else 1) * hidden)
    return y, hx[0].new_empty(hx[0].shape), hx[-1].new_empty(hx[-1].shape)


_DYNAMO_DEFAULT = versions.EXPORT_PARAMS["dynamo"].default if "dynamo" in versions.EXPORT_PARAMS else False
# From this release on, torch.onnx's dynamo exporter writes nn.LSTM/nn.GRU as one ONNX LSTM/GRU with a
# dynamic T by itself (make test-matrix: 2.14.1 still bakes T). Packed input and proj_size still need the patch.
DYNAMO_WRITES_RNN = "2.15"
# torch.library.custom_op (torch >= 2.4) and the translation table of the dynamo exporter onnx_compat uses.
SUPPORTED = versions.HAS_DYNAMO and hasattr(torch.library, "custom_op") and "custom_translation_table" in versions.EXPORT_PARAMS
_custom_op = torch.library.custom_op if SUPPORTED else (lambda *a, **k: (lambda fn: fn))


# The schemas are spelled out: torch 2.6 cannot read the string annotations of this module.
@_custom_op("onnx_compat::rnn", mutates_args=(),
            schema="(Tensor x, Tensor[] hx, Tensor[] params, str mode, int num_layers, bool bidirectional, "
                   "bool batch_first, bool has_biases) -> (Tensor, Tensor, Tensor)")
def rnn_op(x: Tensor, hx: List[Tensor], params: List[Tensor], mode: str, num_layers: int, bidirectional: bool,
           batch_first: bool, has_biases: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``nn.LSTM``/``nn.GRU`` (``mode``) over a padded batch, as one op."""
    return _run_eager(x, None, hx, params, mode, num_layers, bidirectional, batch_first, has_biases)


@_custom_op("onnx_compat::rnn_packed", mutates_args=(),
            schema="(Tensor x, Tensor lengths, Tensor[] hx, Tensor[] params, str mode, int num_layers, "
                   "bool bidirectional, bool batch_first, bool has_biases) -> (Tensor, Tensor, Tensor)")
def rnn_packed_op(x: Tensor, lengths: Tensor, hx: List[Tensor], params: List[Tensor], mode: str, num_layers: int,
                  bidirectional: bool, batch_first: bool, has_biases: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """As ``rnn``, over sequences of ``lengths`` (what packing computes)."""
    return _run_eager(x, lengths, hx, params, mode, num_layers, bidirectional, batch_first, has_biases)


if SUPPORTED:
    @rnn_op.register_fake
    def _rnn_fake(x, hx, params, mode, num_layers, bidirectional, batch_first, has_biases):
        return _fake(x, hx, params, bidirectional)

    @rnn_packed_op.register_fake
    def _rnn_packed_fake(x, lengths, hx, params, mode, num_layers, bidirectional, batch_first, has_biases):
        return _fake(x, hx, params, bidirectional)


class Padded(PackedSequence):
    """What ``pack_padded_sequence`` returns while exporting: the padded batch and its lengths. It is a
    ``PackedSequence`` to the model's code, so a library that packs only what is not packed yet
    (``if not isinstance(x, PackedSequence): x = pack_padded_sequence(x, lengths)``, stanza's PackedLSTM) keeps
    it as it is, and ``data``, ``is_cuda``, ``to()``/``float()``/``cpu()`` work as on a packing. The packing's own
    fields (``batch_sizes``, ``sorted_indices``, ``unsorted_indices``) have no counterpart: reading them (to build
    a ``PackedSequence`` from ``packed.data`` by hand) is refused naming the model's line. As a tuple it holds
    ``(data, None, None, None)``."""

    def __new__(cls, data: Tensor, lengths: Tensor, batch_first: bool):
        return tuple.__new__(cls, (data, None, None, None))

    def __init__(self, data: Tensor, lengths: Tensor, batch_first: bool):
        self.lengths, self.batch_first = lengths, batch_first

    def _packing_field(self, name: str):
        from ._warning_site import frame_site, model_frame_outside_torch
        _refuse(f"{frame_site(model_frame_outside_torch(2))}: reads {name} of a packed sequence while exporting; "
                f"onnx_compat exports packing as the padded batch and its lengths (an ONNX LSTM/GRU with "
                f"sequence_lens), which has no {name}. Compute on the padded tensor before packing "
                f"(pack_padded_sequence(f(x), lengths)) instead of on packed.data")

    batch_sizes = property(lambda self: self._packing_field("batch_sizes"))
    sorted_indices = property(lambda self: self._packing_field("sorted_indices"))
    unsorted_indices = property(lambda self: self._packing_field("unsorted_indices"))

    def to(self, *args, **kwargs) -> "Padded":
        """``PackedSequence.to``: the data converted (the lengths stay where they are, as batch_sizes do)."""
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else Padded(data, self.lengths, self.batch_first)

    def pin_memory(self) -> "Padded":
        return Padded(self.data.pin_memory(), self.lengths, self.batch_first)

    def __reduce__(self):
        return Padded, (self.data, self.lengths, self.batch_first)


_refusals: List[str] = []


def _refuse(message: str):
    """Raise, and remember it: torch.onnx.export may catch the error and retry another way
    (which would bake the time dim); ``_with_translations`` raises it again afterwards."""
    _refusals.append(message)
    raise UnsupportedPattern(message)


def _bind(fn, args, kwargs):
    return inspect.signature(fn).bind(*args, **kwargs).arguments


# Below this release the TorchScript exporter freezes the batch into the zero initial state of an LSTM/GRU
# over a PackedSequence (``int(batch_sizes[0])``; ONNX Runtime: "Input initial_h must have shape {2,1,32}")
TORCHSCRIPT_PACKED_BATCH = "2.1"


def _packed_initial_state(wrapped, args, kwargs, instance):
    """The zero initial state given explicitly, its batch taken from the packing's index tensor."""
    bound = _bind(wrapped, args, kwargs)
    data = bound.get("input")
    if not isinstance(data, PackedSequence) or bound.get("hx") is not None or data.sorted_indices is None:
        return wrapped(*args, **kwargs)
    layers = instance.num_layers * (2 if instance.bidirectional else 1)
    batch = torch.zeros_like(data.sorted_indices, dtype=data.data.dtype)  # [B], B a traced size
    zeros = batch[None, :, None].expand(layers, -1, instance.hidden_size)
    return wrapped(data, (zeros, zeros) if isinstance(instance, torch.nn.LSTM) else zeros)


def rnn_forward(wrapped, instance, args, kwargs):
    """``LSTM.forward``/``GRU.forward`` through the custom op."""
    mode = "LSTM" if isinstance(instance, torch.nn.LSTM) else "GRU"
    projected = getattr(instance, "proj_size", 0) > 0
    if not when.dynamo_exporting() and isinstance(_bind(wrapped, args, kwargs).get("input"), Padded):
        return _paired(wrapped, instance, args, kwargs, projected)
    if not projected and not when.dynamo_exporting():
        if not versions.torch_at_least(TORCHSCRIPT_PACKED_BATCH):
            return _packed_initial_state(wrapped, args, kwargs, instance)
        return wrapped(*args, **kwargs)  # the TorchScript exporter writes LSTM/GRU right itself
    bound = _bind(wrapped, args, kwargs)
    data, hx = bound.get("input"), bound.get("hx")
    name = f"{mode}({instance.input_size}, {instance.hidden_size})"
    if isinstance(data, PackedSequence) and not isinstance(data, Padded):
        if projected and when.torchscript_exporting():
            return _projected_packed(instance, data, hx)
        if projected:
            _refuse(f"onnx_compat: {name} with proj_size={instance.proj_size} over a PackedSequence packed by "
                    "other means than pack_padded_sequence cannot export")
        return wrapped(*args, **kwargs)  # packed by other means than pack_padded_sequence
    if not projected and not isinstance(data, Padded) and versions.torch_at_least(DYNAMO_WRITES_RNN):
        return wrapped(*args, **kwargs)  # this torch's dynamo exporter keeps T dynamic itself
    lengths = None
    if isinstance(data, Padded):
        x, lengths, batch_first = data.data, data.lengths, data.batch_first
    else:
        x, batch_first = data, instance.batch_first
        if x.dim() != 3:
            _refuse(f"onnx_compat: {name} with unbatched {x.dim()}-D input cannot export with a dynamic time "
                    "dim; add a batch dim")
    if projected:
        y, state = lstm_projected(instance, x, lengths, hx, batch_first)
        return (y if lengths is None else Padded(y, lengths, batch_first)), state
    directions = 2 if instance.bidirectional else 1
    batch = x.shape[0] if batch_first else x.shape[1]
    if hx is None:
        zeros = x.new_zeros(instance.num_layers * directions, batch, instance.hidden_size)
        hx = (zeros, zeros) if mode == "LSTM" else zeros
    states = list(hx) if mode == "LSTM" else [hx]
    common = (states, list(instance._flat_weights), mode, instance.num_layers, instance.bidirectional, batch_first,
              instance.bias)
    if lengths is None:
        y, h, c = torch.ops.onnx_compat.rnn(x, *common)
    else:
        y, h, c = torch.ops.onnx_compat.rnn_packed(x, torch.as_tensor(lengths).to(x.device), *common)
        y = Padded(y, lengths, batch_first)
    return (y, (h, c)) if mode == "LSTM" else (y, h)


def _paired(wrapped, instance, args, kwargs, projected: bool):
    """TorchScript, a ``Padded`` input (``pack_padded_sequence`` while exporting): packed for this RNN alone and
    unpacked right after it, the one pair the TorchScript exporter writes (an ONNX LSTM/GRU with
    ``sequence_lens``), whatever the model does around it: a final state read without ``pad_packed_sequence``
    ("vector::_M_range_check"), or several RNNs on one packing."""
    bound = _bind(wrapped, args, kwargs)
    data, hx = bound["input"], bound.get("hx")
    if projected:
        y, state = lstm_projected(instance, data.data, data.lengths, hx, data.batch_first)
        return Padded(y, data.lengths, data.batch_first), state
    rnn_utils = torch.nn.utils.rnn
    pack, pad = (getattr(f, "__wrapped__", f) for f in (rnn_utils.pack_padded_sequence, rnn_utils.pad_packed_sequence))
    packed = pack(data.data, data.lengths, batch_first=data.batch_first, enforce_sorted=False)
    y, state = wrapped(packed, hx)
    y, _ = pad(y, batch_first=data.batch_first, total_length=data.data.shape[1 if data.batch_first else 0])
    return Padded(y, data.lengths, data.batch_first), _tied(state, y, data.batch_first)


def _tied(state, y, batch_first: bool):
    """The final state made to depend on the unpacked outputs by adding zero (each sequence's own sum times 0;
    RNN outputs are bounded, so it is exact): a model that reads only the final state leaves the unpacking dead,
    the exporter drops it, and the packing alone fails to export ("vector::_M_range_check")."""
    zero = (y.sum(dim=(1, 2) if batch_first else (0, 2)) * 0)[None, :, None]
    return tuple(s + zero for s in state) if isinstance(state, tuple) else state + zero


def _projected_packed(module, packed: PackedSequence, hx):
    """TorchScript: unpack, run the projected LSTM with lengths, pack again (the exporter
    writes packing as the padded tensor and its lengths). ``hx`` and ``h_n``/``c_n``
    are in the batch's own order, as ``nn.LSTM`` takes and returns them."""
    rnn_utils = torch.nn.utils.rnn
    x, lengths = rnn_utils.pad_packed_sequence(packed)
    y, state = lstm_projected(module, x, lengths, hx, batch_first=False)
    return rnn_utils.pack_padded_sequence(y, lengths, enforce_sorted=packed.sorted_indices is None), state


def pack_padded(wrapped, instance, args, kwargs):
    bound = _bind(wrapped, args, kwargs)
    if isinstance(bound["input"], PackedSequence):  # PyTorch refuses it too (TypeError or AttributeError)
        from ._warning_site import frame_site, model_frame_outside_torch
        raise TypeError(f"{frame_site(model_frame_outside_torch(1))}: pack_padded_sequence() was given a packed "
                        "sequence; it packs a padded tensor (PyTorch refuses this too). Pack once, or check "
                        "isinstance(x, PackedSequence) first")
    return Padded(bound["input"], torch.as_tensor(bound["lengths"]), bound.get("batch_first", False))


def pad_packed(wrapped, instance, args, kwargs):
    bound = _bind(wrapped, args, kwargs)
    sequence = bound["sequence"]
    if not isinstance(sequence, Padded):
        return wrapped(*args, **kwargs)
    batch_first, padding_value = bound.get("batch_first", False), bound.get("padding_value", 0.0)
    total_length: Optional[int] = bound.get("total_length")
    y = sequence.data if sequence.batch_first == batch_first else sequence.data.transpose(0, 1)
    time_axis = 1 if batch_first else 0
    if isinstance(total_length, torch.Tensor):  # a size TorchScript traced: the input's own time, which y has
        total_length = None
    if total_length is not None and total_length > y.shape[time_axis]:
        pad = [0, 0] * (y.dim() - 1 - time_axis) + [0, total_length - y.shape[time_axis]]
        y = torch.nn.functional.pad(y, pad)
    # padded frames hold padding_value: an RNN's are zeros already, a packing unpacked as it is holds the input's
    steps = torch.arange(y.shape[time_axis], device=y.device)
    valid = steps[None, :] < sequence.lengths.to(y.device)[:, None]  # [B, T]
    valid = valid if batch_first else valid.transpose(0, 1)
    y = y.masked_fill(~valid.reshape(valid.shape + (1,) * (y.dim() - 2)), padding_value)
    return y, sequence.lengths.long()


def translations() -> dict:
    """Our custom ops -> their ONNX translations (onnxscript imported on use), the diagonals' ATen ops
    where ``diagonal_gather`` is in place, and the ATen ops whose number may be a size of the graph
    (``_symbolic_scalars_onnx``)."""
    from onnx_compat.patches import _rnn_onnx as rnn_onnx, _symbolic_scalars_onnx, diagonals
    return {torch.ops.onnx_compat.rnn.default: rnn_onnx.rnn,
            torch.ops.onnx_compat.rnn_packed.default: rnn_onnx.rnn_packed, **diagonals.translations(),
            **_symbolic_scalars_onnx.translations()}


def packing(wrapped, instance, args, kwargs):
    """One patch for the pair: packing and unpacking only make sense together."""
    return (pack_padded if wrapped.__name__ == "pack_padded_sequence" else pad_packed)(wrapped, instance, args, kwargs)


def _with_translations(wrapped, instance, args, kwargs):
    """``torch.onnx.export`` with our custom ops' translations added to the caller's table;
    a patch's refusal is raised even when the exporter swallowed it and retried. A write into a diagonal
    that ``diagonal_gather`` read as a copy is refused after either exporter (``diagonals.copies_watched``).
    The model is left as it was: a cache its forward fills (a causal mask registered as a buffer when a longer
    sequence comes, as simple-hierarchical-transformer's attention does) would otherwise keep the trace's fake
    tensor, which eager then fails on (``aten.equal`` of a fake tensor, the sweep's round five)."""
    from onnx_compat.model_state import preserved
    from onnx_compat.patches.diagonals import copies_watched
    model = args[0] if args else kwargs.get("model")
    kept = preserved(model, evaluate=False) if isinstance(model, torch.nn.Module) else contextlib.nullcontext()
    with copies_watched(), kept:
        return _exported(wrapped, args, kwargs)


def _exported(wrapped, args, kwargs):
    if not kwargs.get("dynamo", _DYNAMO_DEFAULT):
        return wrapped(*args, **kwargs)
    kwargs["custom_translation_table"] = {**translations(), **(kwargs.get("custom_translation_table") or {})}
    del _refusals[:]
    try:
        result = wrapped(*args, **kwargs)
    except Exception as exc:
        if _refusals:
            raise UnsupportedPattern(_refusals[0]) from exc
        raise
    if _refusals:
        raise UnsupportedPattern(_refusals[0])
    return result


# Registered on every torch so that an older one names the release it needs (``min_torch``).
register(Patch(
    name="onnx_translations",
    description="torch.onnx.export(dynamo=True) gets the ONNX translations of onnx_compat's custom ops, "
                "of the diagonals' ATen ops (diagonal_gather) and of remainder, pow, the bitwise ops and shifts "
                "whose number is a size of the graph (i % x.shape[1]) "
                "(added to the caller's custom_translation_table); the model is left as it was after either "
                "exporter (a cache its forward filled keeps no traced tensor)",
    targets=("torch.onnx:export",),
    wrapper=_with_translations,
    when="always",
    aliases=False,
    min_torch=versions.DYNAMO_SINCE,
))
register(Patch(
    name="rnn_dynamic_time",
    description="nn.LSTM/nn.GRU export with a dynamic time dim under dynamo (one ONNX LSTM/GRU per layer "
                "instead of T unrolled steps; repeated exports work); LSTM(proj_size) under both exporters "
                "(ONNX Scan/Loop over time); packed input keeps its batch under torch 2.0's TorchScript",
    targets=("torch.nn.modules.rnn:LSTM.forward", "torch.nn.modules.rnn:GRU.forward"),
    wrapper=rnn_forward,
    when="export",
    aliases=False,
    requires=("onnx_translations",) if SUPPORTED else (),  # the translations serve its dynamo path
))
register(Patch(
    name="packed_sequences",
    description="pack_padded_sequence -> LSTM/GRU -> pad_packed_sequence exports under dynamo "
                "(ONNX sequence_lens: zeros at padded frames, h_n/c_n per sequence); under TorchScript each RNN "
                "gets its own pack/unpack pair, so a final state read alone or a packing unpacked as it is exports",
    targets=("torch.nn.utils.rnn:pack_padded_sequence", "torch.nn.utils.rnn:pad_packed_sequence"),
    wrapper=packing,
    when="export",
    requires=("rnn_dynamic_time",),
    min_torch=versions.DYNAMO_SINCE,
))
