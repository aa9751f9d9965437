"""The ``state-managed-onnx`` graph around the user's step, its export, and the folder it is written into.

``StepGraph`` is the wrapper the graph is exported from (int32 ``token [B, S]`` and its length, the states
with ``prefix-length``, the batch-1 encoder states repeated to the hypotheses, costs out); ``specs`` its
inputs, outputs and io-map; ``check_inputs_used`` refuses a step that ignores one of them before any export;
``export_graphs`` runs each graph through ``export()`` into a temporary folder and moves them in only after
the proof passed; ``finish`` writes the report last.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import onnx
import torch

from onnx_compat.model_state import preserved
from onnx_compat.parts.export import PartsReport, _move_into, _own_sizes
from onnx_compat.parts.part import Part, PartModule
from onnx_compat.pipeline.adapter import flatten
from onnx_compat.pipeline.files import write_text_atomically
from onnx_compat.spec import Dim, TensorSpec

from . import folders
from .errors import LabelScorerError
from .graphs import ENCODER_STATES, FRAMES_EXAMPLE
from .rasr_specs import KINDS, graphs_of
from .reports import REPORT_FILE

if TYPE_CHECKING:  # the layout is state_managed.py's, which imports this module
    from .state_managed import _Layout

SIZES = {"suffix": 3, "prefix": 5, "history": 2, "frames": FRAMES_EXAMPLE}


class StepGraph(torch.nn.Module):
    """The user's step as the graph RASR calls: ONNX inputs ``token``, its length, the states (the first
    with its length: ``prefix-length``), the encoder states and their size; outputs costs, the states."""

    def __init__(self, step: Callable, owner: Optional[torch.nn.Module], flavour: str, n_states: int, encoder: bool,
                 encoder_lengths: bool, sign: float) -> None:
        super().__init__()
        self.step, self.owner, self.flavour, self.n = step, owner, flavour, n_states
        self.encoder, self.encoder_lengths, self.sign = encoder, encoder_lengths, sign

    def forward(self, token, token_length, *rest):
        rest = list(rest)
        prefix = None
        if self.flavour != "recurrent":
            states = [rest.pop(0)]
            prefix = rest.pop(0).long()
            states += [rest.pop(0) for _ in range(self.n - 1)]
        else:
            states = [rest.pop(0) for _ in range(self.n)]
        enc_args = ()
        if self.encoder:
            enc = rest.pop(0)
            lengths = rest.pop(0) if self.encoder_lengths else torch.ones(1, dtype=torch.int32) * enc.shape[1]
            enc_args = (enc.expand(token.shape[0], -1, -1), lengths.long().expand(token.shape[0]))
        if self.flavour == "cache":
            out = flatten(self.step(token.long(), token_length.long(), prefix, *states, *enc_args))
            return (self.sign * out[0],) + tuple(out[1:])
        if self.flavour == "recurrent-stacked":  # the parent's state: the last position, zeros for no prefix
            has = (prefix > 0)[:, None]
            states = [torch.where(has, torch.cat([torch.zeros_like(s.sum(1, keepdim=True)), s], 1)[:, -1], 0.0)
                      for s in states]
        out = flatten(self.step(token[:, 0].long(), *states, *enc_args))
        keep = (token_length > 0)[:, None]  # a zero-length suffix leaves the state as it was
        new = [torch.where(keep, n, s) for n, s in zip(out[1:], states)]
        if self.flavour == "recurrent-stacked":
            new = [n[:, None] for n in new]
        return (self.sign * out[0][:, None],) + tuple(new)


def specs(layout: _Layout, states, batch, vocab, encoder_dim, uses_length, suffix_only):
    """The graph's inputs and outputs and the io-map (RASR spec key -> ONNX name)."""
    hyps = Dim(batch)
    if layout.flavour == "cache":
        suffix = Dim("suffix")
        token = TensorSpec("token", [hyps, suffix], torch.int32, lengths=[1], values=(0, vocab))
        inputs = [token]
        maps = {"token": "token", "token-length": "token:size1"}
        time_dim = Dim("prefix")
    else:
        suffix = 1
        inputs = [TensorSpec("token", [hyps, 1], torch.int32, values=(0, vocab)),
                  TensorSpec("token_length", [hyps], torch.int32, values=(1, 2))]
        maps = {"token": "token", "token-length": "token_length"}
        time_dim = Dim("history")
    outputs = [TensorSpec("scores", [hyps, suffix, vocab])]
    for i, spec in enumerate(states):
        rest = [d for d in spec.dims[1:] if not isinstance(d, Dim)]
        if layout.flavour == "recurrent":
            inputs.append(TensorSpec(f"{spec.name}_in", [hyps] + rest))
            outputs.append(TensorSpec(f"{spec.name}_out", [hyps] + rest))
            continue
        dims = [hyps] + [time_dim if isinstance(d, Dim) else d for d in spec.dims[1:]]
        if layout.flavour == "recurrent-stacked":
            dims = [hyps, time_dim] + rest
        inputs.append(TensorSpec(f"{spec.name}_in", dims, lengths=[dims.index(time_dim)] if i == 0 else []))
        out_time = suffix if layout.flavour == "cache" and suffix_only else (1 if layout.flavour != "cache" else None)
        outputs.append(TensorSpec(f"{spec.name}_out", [out_time if d is time_dim else d for d in dims]))
        if i == 0:
            maps["prefix-length"] = inputs[-1].onnx_names[1]
    scorer_map = {**maps, "scores": "scores"}
    result = {"scorer": scorer_map}
    if encoder_dim is not None:
        inputs.append(TensorSpec(ENCODER_STATES, [1, Dim("frames"), encoder_dim], lengths=[1] if uses_length else []))
        scorer_map["encoder-states"] = ENCODER_STATES
        if uses_length:
            scorer_map["encoder-states-size"] = f"{ENCODER_STATES}:size1"
    return inputs, outputs, result


def check_inputs_used(wrapper: torch.nn.Module, inputs: Sequence[TensorSpec], seed: int, zeroed=frozenset()) -> None:
    """Each graph input, changed alone, changes an output: a step that ignores one (its token lengths, the
    prefix lengths that mark the padding) would be written without it, and RASR's io-map would name an input
    the graph lacks. ``zeroed``: inputs changed to 0 (a one-label suffix's length, which then keeps the old
    state; a one-position history's length, which then starts from zeros)."""
    from onnx_compat.parts.probe import _changed, example_feeds
    from onnx_compat.spec import dim_sizes
    feeds = example_feeds(inputs, dim_sizes(inputs, _own_sizes(inputs, SIZES)), seed)
    owner = {n: spec for spec in inputs for n in spec.onnx_names}
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad(), preserved(wrapper):
        base = flatten(wrapper(*feeds.values()))
        for name, value in feeds.items():
            other = dict(feeds)
            other[name] = value * 0 if name in zeroed else _changed(name, value, owner[name], gen)
            if all(torch.equal(a, b) for a, b in zip(base, flatten(wrapper(*other.values())))):
                raise LabelScorerError(f"the step ignores graph input {name!r} (changed alone, no output changed): "
                                       "the exporter would leave it out and RASR's io-map would name an input the "
                                       "graph lacks", graph="scorer", tensor=name, rule="every input is used")


def encoder_graph(encoder, owner, features: TensorSpec, encoder_dim: int, maps):
    part = Part("encoder", encoder, [features],
                [TensorSpec(ENCODER_STATES, [features.dims[0], Dim("frames"), encoder_dim], lengths=[1])], module=owner)
    maps["encoder"] = {"features": features.name, "outputs": ENCODER_STATES,
                       **({"features-size": features.onnx_names[1]} if features.lengths else {})}
    return ("encoder", PartModule(part, {}, "batch", False), list(part.inputs), list(part.outputs), {})


def export_graphs(graphs, folder: str, exporter, atol, rtol, seed, check: Callable, extra_files) -> PartsReport:
    """Each graph through ``export()`` into a temporary folder beside ``folder``; ``check`` on them all; then
    the files moved in. Nothing is written unless every graph verified and ``check`` passed."""
    from onnx_compat import export
    names = [g[0] for g in graphs]
    if not isinstance(exporter, str) and set(exporter) - set(names):
        raise LabelScorerError(f"exporter= names {sorted(set(exporter) - set(names))}; the graphs are {names}",
                               tensor="exporter", rule="exporter per graph")
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    report = PartsReport(folder)
    with tempfile.TemporaryDirectory(prefix=".state-managed-", dir=parent) as tmp:
        protos = {}
        for name, module, inputs, outputs, metadata in graphs:
            path = os.path.join(tmp, f"{name}.onnx")
            chosen = exporter if isinstance(exporter, str) else exporter.get(name, "auto")
            with preserved(module):
                try:
                    report.graphs[name] = export(module, path, inputs, outputs, exporter=chosen, atol=atol, rtol=rtol,
                                                 sizes=_own_sizes(inputs, SIZES) or None, seed=seed,
                                                 metadata=metadata, external_data=False)
                except Exception as exc:
                    exc.add_note(f"(while exporting graph {name!r})")
                    raise
            protos[name] = onnx.load(path)
        check(protos)
        for name, text in extra_files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        _move_into(tmp, folder, [f"{n}.onnx" for n in names] + list(extra_files), report)
    return report


def finish(report, parts: PartsReport, earlier: Sequence[str], t0: float) -> None:
    """The graphs' summary into the report, an earlier export's files not written again removed, the report
    written last: a ``report.json`` in the folder means every step passed."""
    summary = parts.to_dict()
    report.graphs, report.files = summary["graphs"], dict(parts.files)
    report.removed = folders.remove_stale(report.folder, earlier, list(parts.files.values()))
    report.files["report"] = os.path.join(report.folder, REPORT_FILE)
    report.timings["total"] = time.perf_counter() - t0
    write_text_atomically(report.files["report"], report.to_json() + "\n")


def earlier_files(folder: str, writes: set) -> List[str]:
    """``folders.earlier_files`` for these kinds' files: what an earlier export's report names (removed once
    this one is written, if not written again); a label scorer's graph that no report names is refused."""
    if not os.path.isdir(folder):
        return []
    own = folders._report_files(folder)
    known = {f"{g}.onnx" for k in KINDS for g in graphs_of(k)}
    foreign = sorted(n for n in os.listdir(folder) if n in known - writes and os.path.join(folder, n) not in own)
    if foreign:
        raise LabelScorerError(f"the folder {folder!r} holds {foreign}, which this export does not write and no "
                               "report.json of an earlier export there names: beside the new label-scorer.config "
                               "they would be read as part of it, and they may be yours; move them or choose "
                               "another folder", tensor=foreign[0], rule="folder holds no stale graphs")
    return own
