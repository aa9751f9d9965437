"""``export_nemo_transducer``: a NeMo RNN-T or TDT model written as sherpa-onnx's NeMo transducer, proven.

One call on the NeMo model object (``EncDecRNNTBPEModel``-shaped: ``encoder``, ``decoder``, ``joint``, ``cfg``,
optionally ``preprocessor``): the shapes, the metadata and tokens.txt are read off the model (``joint.vocabulary``
then ``<blk>``; ``decoder.pred_rnn_layers`` / ``pred_hidden``; ``encoder._feat_in``; ``cfg.preprocessor.normalize``;
TDT's ``cfg.model_defaults.tdt_durations``) and checked before anything runs; the three graphs go through
``export_parts`` (each exported and verified at new shapes by ``export()``) in NeMo's own layouts (encoder
``[N, C, T]`` channels first, the decoder's ``(targets, target_length, h, c)``, the joint's ``[N, D, T]`` and
``[N, H, U]``); the graphs are checked against the contract; WAV files are decoded in sherpa-onnx (Python with
``model_type="nemo_transducer"``, and the native binary) against PyTorch's greedy decode by sherpa-onnx's rules on
sherpa-onnx's features; only then are ``encoder.onnx``, ``decoder.onnx``, ``joiner.onnx`` and ``tokens.txt``
written. The report also measures sherpa-onnx's front end against the model's own preprocessor.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import onnx
import torch

from onnx_compat.contracts import sherpa_nemo_transducer as c
from onnx_compat.contracts.base import Finding
from onnx_compat.contracts.sherpa_nemo_transducer_consumers import CONSUMERS, NemoEager, frontend_difference
from onnx_compat.spec import Dim, TensorSpec


@dataclass
class NemoTransducerReport:
    """What was written (``parts``: the ``PartsReport``), the encoder's metadata, what the consumers said, and
    sherpa-onnx's front end measured against the model's (``frontend``; empty without a preprocessor)."""

    parts: object
    metadata: Dict[str, str]
    consumer_checks: List[dict] = field(default_factory=list)
    frontend: Dict[str, object] = field(default_factory=dict)
    contract: str = c.NAME
    model_type: str = c.MODEL_TYPE  # what OfflineRecognizer.from_transducer(model_type=...) needs

    def to_dict(self) -> dict:
        return {"name": self.contract, "model_type": self.model_type, "metadata": self.metadata,
                "files": sorted(self.parts.files), "consumer_checks": self.consumer_checks, "frontend": self.frontend}


def _cfg(model, *keys):
    """``model.cfg[k1][k2]`` for a dict or an OmegaConf config; None when absent."""
    node = getattr(model, "cfg", None)
    for key in keys:
        if node is None:
            return None
        node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    return node


def read_shapes(model, durations: Optional[Sequence[int]]) -> c.Shapes:
    """The dims the contract needs, from NeMo's attribute names; a model without them is refused by name."""
    missing = [f"{part}.{name}" for part, name in (("encoder", "_feat_in"), ("encoder", "_feat_out"),
                                                   ("decoder", "pred_rnn_layers"), ("decoder", "pred_hidden"),
                                                   ("decoder", "vocab_size"), ("joint", "vocabulary"),
                                                   ("joint", "num_extra_outputs"))
               if not hasattr(getattr(model, part, None), name)]
    if missing:
        c.check([Finding("model", "a NeMo transducer (EncDecRNNTBPEModel: encoder, decoder, joint)",
                         f"{type(model).__name__} without {missing}")])
    if durations is None:
        durations = _cfg(model, "model_defaults", "tdt_durations") or ()
    return c.Shapes(int(model.encoder._feat_in), int(model.encoder._feat_out), int(model.decoder.pred_rnn_layers),
                    int(model.decoder.pred_hidden), int(model.decoder.vocab_size), tuple(int(d) for d in durations))


def _normalize_type(model) -> Optional[str]:
    featurizer = getattr(getattr(model, "preprocessor", None), "featurizer", None)
    value = getattr(featurizer, "normalize", None) or _cfg(model, "preprocessor", "normalize")
    return None if value is None else str(value)


def _eager_findings(model, shapes: c.Shapes) -> List[Finding]:
    """The eager decoder on sherpa-onnx's first call (the blank, id ``vocab_size``, zero states) and the joint's
    width on one frame, as sherpa-onnx will call them."""
    found = []
    zeros = torch.zeros(shapes.pred_rnn_layers, 1, shapes.pred_hidden)
    try:
        with torch.no_grad():
            g = NemoDecoder(model.decoder)(torch.tensor([[shapes.vocab_size]], dtype=torch.int32),
                                           torch.tensor([1], dtype=torch.int32), zeros, zeros.clone())[0]
            logits = NemoJoint(model.joint)(torch.zeros(1, shapes.encoder_dim, 1), g)
    except Exception as exc:  # noqa: BLE001 - the model's own refusal is the finding
        return [Finding(f"decoder on the blank (id {shapes.vocab_size}: sherpa-onnx's first token) with zero states",
                        "runs (NeMo's blank_as_pad embeds it)", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")]
    found += c.joiner_width_findings(int(logits.shape[-1]), shapes, "the joint's output width")
    if tuple(g.shape) != (1, shapes.pred_hidden, 1):
        found.append(Finding("decoder output 0 on one token", f"[1, {shapes.pred_hidden}, 1] (sherpa-onnx feeds it to "
                             "the joiner as is)", f"{list(g.shape)}"))
    return found


def check_model(model, vocabulary, shapes: c.Shapes, meta: Mapping[str, str]) -> None:
    """Everything knowable before exporting, as one ``ContractError``."""
    training = [name for name in ("model", "encoder", "decoder", "joint")
                if getattr(model if name == "model" else getattr(model, name), "training", False)]
    if training:  # dropout and batch norm in training mode: the graphs would not be the model's decode
        c.check([Finding("model", "in eval mode (model.eval())", f"training mode ({', '.join(training)})")])
    joint_vocab = list(model.joint.vocabulary)
    found = []
    if len(joint_vocab) != shapes.vocab_size:
        found.append(Finding("joint.vocabulary", f"{shapes.vocab_size} tokens (decoder.vocab_size; the blank after "
                             "them)", f"{len(joint_vocab)}"))
    found += c.durations_findings(shapes, int(model.joint.num_extra_outputs))
    found += c.vocabulary_findings(vocabulary, shapes) + c.metadata_findings(meta, shapes)
    c.check(found or _eager_findings(model, shapes))


class NemoEncoder(torch.nn.Module):
    """NeMo's encoder as sherpa-onnx calls it (keyword arguments: NeMo's ``typecheck`` takes no others)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, audio_signal, length):
        out = self.encoder(audio_signal=audio_signal, length=length)
        return out[0], out[1]


class NemoDecoder(torch.nn.Module):
    """NeMo's ``RNNTDecoder`` as sherpa-onnx calls it: ``(targets, target_length, h, c) -> (g, length, h, c)``, its
    ``states=[h, c]`` list flattened; run in export mode (``_rnnt_export``: no start symbol prepended)."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, targets, target_length, h, c):
        g, length, states = self.decoder(targets=targets, target_length=target_length, states=[h, c])
        return g, length, states[0], states[1]


class NemoJoint(torch.nn.Module):
    def __init__(self, joint):
        super().__init__()
        self.joint = joint

    def forward(self, encoder_outputs, decoder_outputs):
        return self.joint(encoder_outputs=encoder_outputs, decoder_outputs=decoder_outputs)


class _export_mode:
    """The decoder's ``_rnnt_export`` on for the call (NeMo's ``_prepare_for_export`` sets it), restored after."""

    def __init__(self, decoder):
        self.decoder, self.had = decoder, getattr(decoder, "_rnnt_export", None)

    def __enter__(self):
        if self.had is not None:
            self.decoder._rnnt_export = True

    def __exit__(self, *exc):
        if self.had is not None:
            self.decoder._rnnt_export = self.had


def _parts(model, shapes: c.Shapes):
    from onnx_compat.parts import Part
    from onnx_compat.streaming import StateSpec
    n = Dim("batch")
    state = [shapes.pred_rnn_layers, n, shapes.pred_hidden]
    states = [StateSpec("h", state), StateSpec("c", state)]
    t, u = Dim("enc_frames"), Dim("dec_steps")
    parts = [
        Part("encoder", NemoEncoder(model.encoder),
             [TensorSpec("audio_signal", [n, shapes.feat_dim, Dim("time", min=16)], lengths=[2],
                         lengths_dtype=torch.int64)],
             [TensorSpec("outputs", [n, shapes.encoder_dim, Dim("frames")], lengths=[2], lengths_dtype=torch.int32)]),
        Part("decoder", NemoDecoder(model.decoder),
             [TensorSpec("targets", [n, 1], torch.int32, values=(0, shapes.vocab_size + 1)),
              TensorSpec("target_length", [n], torch.int32, values=(1, 3))],
             [TensorSpec("outputs", [n, shapes.pred_hidden, 1]), TensorSpec("prednet_lengths", [n], torch.int32)],
             states_in=["h", "c"], states_out=["h", "c"]),
        Part("joiner", NemoJoint(model.joint),
             [TensorSpec("encoder_outputs", [n, shapes.encoder_dim, t]),
              TensorSpec("decoder_outputs", [n, shapes.pred_hidden, u])],
             [TensorSpec("outputs", [n, t, u, shapes.width])]),
    ]
    return parts, states


def export_nemo_transducer(model, folder: str, *, vocabulary: Optional[Sequence[str]] = None,
                           durations: Optional[Sequence[int]] = None, exporter="auto",
                           metadata: Optional[Mapping[str, str]] = None, verify: bool = True) -> NemoTransducerReport:
    """Write a NeMo RNN-T / TDT ``model`` into ``folder`` as sherpa-onnx's NeMo transducer loader reads it.

    ``vocabulary``: tokens.txt's symbols, ``<blk>`` last (default: ``model.joint.vocabulary + ["<blk>"]``).
    ``durations``: TDT's (default: ``model.cfg.model_defaults.tdt_durations``; empty: RNN-T). ``metadata``: the
    encoder's keys over the derived ones (``url``, ``normalize_type``, ...), checked like them. ``exporter``: one
    for all graphs or ``{graph: exporter}``. ``verify``: decode in each installed sherpa-onnx consumer before writing.
    Load the files with ``OfflineRecognizer.from_transducer(..., model_type="nemo_transducer")``.
    """
    shapes = read_shapes(model, durations)
    vocabulary = list(model.joint.vocabulary) + [c.BLANK] if vocabulary is None else list(vocabulary)
    meta = _metadata(model, shapes, metadata)
    with _export_mode(model.decoder):
        check_model(model, vocabulary, shapes, meta)
        parts, states = _parts(model, shapes)
        parts[0].metadata = meta
        eager = NemoEager(*(p.fn for p in parts), shapes.vocab_size, shapes.pred_rnn_layers, shapes.pred_hidden,
                          shapes.durations, "" if meta["normalize_type"] == "NA" else meta["normalize_type"])
        checks: List[dict] = []

        def judge(protos: Mapping[str, onnx.ModelProto]) -> None:
            c.check_graphs(protos, meta, vocabulary, shapes)
            if verify:
                checks.extend(_in_consumers(protos, eager, vocabulary, shapes.feat_dim))

        from onnx_compat.parts.export import export_parts
        report = export_parts(parts, folder, states, exporter=exporter, checks=[judge],
                              extra_files={"tokens.txt": c.tokens_text(vocabulary)})
        frontend = {}
        if verify and getattr(model, "preprocessor", None) is not None and all(k.get("ok") for k in checks):
            frontend = frontend_difference(model.preprocessor, eager, shapes.feat_dim)
    return NemoTransducerReport(report, meta, checks, frontend)


def _metadata(model, shapes: c.Shapes, metadata: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The encoder's metadata from the model, the user's values on top; no normalisation known is refused."""
    normalize = _normalize_type(model)
    user = {k: str(v) for k, v in (metadata or {}).items()}
    if normalize is None and "normalize_type" not in user:
        c.check([Finding("normalize_type", "the model's preprocessor normalize (cfg.preprocessor.normalize)",
                         "none found", fix="pass metadata={'normalize_type': 'per_feature' or 'NA'}")])
    return c.encoder_metadata(shapes, int(getattr(model.encoder, "subsampling_factor", 8)), normalize or "", user)


def _in_consumers(protos, eager: NemoEager, vocabulary: List[str], bins: int) -> List[dict]:
    """The graphs as they will be written, in a temporary folder, decoded by each installed consumer."""
    out = []
    with tempfile.TemporaryDirectory(prefix="onnx_compat_sherpa_nemo_") as folder:
        for name, proto in protos.items():
            onnx.save(proto, os.path.join(folder, f"{name}.onnx"))
        with open(os.path.join(folder, "tokens.txt"), "w", encoding="utf-8") as fh:
            fh.write(c.tokens_text(vocabulary))
        for consumer in CONSUMERS:
            missing = consumer.available()
            if missing:
                out.append({"consumer": consumer.name, "ok": None, "skipped": missing})
                continue
            out.append(consumer.verify(folder, eager, vocabulary, bins))
    return out
