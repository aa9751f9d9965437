"""``export_label_scorer``: a folder RASR's label scorers load, proven by decoding before it is written.

arguments checked -> the callables rehearsed in eager PyTorch (states,
scores, vocabulary, sign, which lengths they read) -> the graphs built
around them (``graphs.py``) and exported through ``parts.export_parts`` (each
verified by ``export()`` at new shapes, states batch-first and alike in
every graph) -> RASR's loader emulated on them with the config fragment as
written (``loader.py``) -> the decode proof (``proof.py``) -> the folder:
the graphs, ``label-scorer.config``, ``report.json``. Nothing is written
unless every step passed.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import onnx
import torch

from onnx_compat.parts import export_parts
from onnx_compat.pipeline.files import write_text_atomically
from onnx_compat.spec import TensorSpec

from onnx_compat.spec import Dim
from onnx_compat.streaming.states import StateSpec

from . import checks, config, folders, loader
from .backends import RasrEmulator, TorchCallables
from .graphs import FRAMES, FRAMES_EXAMPLE, Callables, build, with_steps
from .proof import check_decoded, prove, refuse_empty_early
from .rasr_specs import KINDS, STATEFUL
from .rehearsal import check_eval_mode, rehearse, utterance_lengths
from .reports import CONFIG_FILE, REPORT_FILE, LabelScorerReport


def export_label_scorer(folder: str, *, kind: str, encoder: Optional[Callable] = None,
                        features: Optional[TensorSpec] = None, encoder_dim: Optional[int] = None,
                        score: Callable, vocabulary: Sequence[str], initial: Optional[Callable] = None,
                        update: Optional[Callable] = None, states: Sequence = (),
                        updater_states: Optional[Sequence[str]] = None, scorer_states: Optional[Sequence[str]] = None,
                        blank: Optional[int] = None, sentence_end: Optional[int] = None, scores: str = "log-probs",
                        history: int = 1, start_label: int = 0, release: str = "master", batch: str = "hyps",
                        module: Optional[torch.nn.Module] = None, exporter: Union[str, Mapping[str, str]] = "auto",
                        utterances: Optional[Sequence[int]] = None, beam: int = 4, max_symbols: int = 3,
                        atol: float = 1e-4, rtol: float = 1e-3, seed: int = 0,
                        progress: Optional[Callable[[str], None]] = None,
                        manager: Optional[str] = None, max_labels: int = 20) -> LabelScorerReport:
    """Export a label scorer for RASR into ``folder``; prove it by decoding; return the report.

    ``kind``: ``"stateful"`` (``stateful-onnx``: AED, LSTM LM), ``"transducer"``
    (``stateful-transducer-onnx``, needs ``release="transducer-pr"``), ``"fixed-context"``
    (``fixed-context-onnx``), ``"ctc"`` (``no-context-onnx``), ``"state-managed"`` (``state-managed-onnx``
    with ``manager=`` ``"transformer"`` or ``"lstm"``: ``state_managed.export_state_managed`` documents it; an
    LM needs no encoder). Callables, in PyTorch's own terms (the
    hypothesis batch B everywhere, tokens int64, states in their modules' layout):

    - ``encoder(features [B, T, F], lengths [B]) -> (frames [B, T', E], lengths [B])``;
    - stateful: ``initial(frames [1, T', E], lengths [1]) -> states`` (after the start label: RASR feeds
      none), ``update(token [B], frames [B, T', E], lengths [B], *updater_states) -> states``,
      ``score(*scorer_states) -> [B, V]``;
    - transducer: ``initial() -> states`` (batch 1), ``update(token [B], *updater_states) -> states``,
      ``score(frame [B, E], *scorer_states) -> [B, V]``;
    - fixed-context: ``score(frame [B, E], history [B, history]) -> [B, V]`` (oldest label first);
    - ctc: ``score(frame [B, E]) -> [B, V]``.

    ``states``: ``StateSpec``s in the order the callables return them, their hypothesis batch a ``Dim``
    named ``batch``; ``updater_states``/``scorer_states``: the ones each reads (default all).
    ``exporter``: for every graph, or ``{graph: exporter}`` (``"encoder"``, ``"state-updater"``, ...; the
    others ``"auto"``).
    ``scores``: ``"log-probs"`` (the graph negates them) or ``"costs"``. ``vocabulary``: the labels in the
    lexicon's order (V = its size). ``utterances``: feature lengths decoded in the proof (default: the
    encoder's export example, one at least four times longer in feature frames and in the decoder graphs'
    encoder frames, and the shortest that gives one encoder frame). ``progress``: told each stage as it starts
    (the rehearsal, each graph's export stages, the proof), as ``export(progress=)`` is.
    """
    if kind in ("state-managed", "full-context") or manager is not None:
        from .state_managed import dispatch
        return dispatch(folder, locals())
    if encoder is None:
        raise checks.LabelScorerError(f"kind={kind!r} needs encoder=, features= and encoder_dim= (only "
                                      "kind='state-managed' scores without an encoder: an LM)", graph="encoder",
                                      tensor="encoder", rule="encoder given")
    t0 = time.perf_counter()
    states, updater_states, scorer_states = _checked(kind, release, scores, vocabulary, blank, sentence_end, history,
                                                     features, beam, states, updater_states, scorer_states, batch)
    folder = config.check_value(os.path.abspath(folder), "folder")
    earlier = folders.earlier_files(folder, kind)
    fns = Callables(encoder, score, initial, update, module or checks.weights_owner(encoder, initial, update, score))
    check_eval_mode(fns.module)
    measured: dict = {}
    if progress is not None:
        progress("rehearsing the callables in PyTorch")
    uses_length = rehearse(kind, fns, features, encoder_dim, states, updater_states, scorer_states, vocabulary,
                           scores, history, batch, seed, measured)
    states = framed_states(states, measured.get("frames_sized", {}))
    parts, maps = build(kind, fns, features, encoder_dim, states, updater_states, scorer_states, len(vocabulary),
                        scores == "log-probs", history, batch, uses_length)
    settings, search = _settings(kind, blank, sentence_end, history, start_label)
    text = config.fragment(kind, release, folder, maps, settings, search)
    report = LabelScorerReport(folder, kind, KINDS[kind]["type"], release, config=text,
                               uses_encoder_lengths=dict(uses_length))
    torch_scorer = TorchCallables(kind, fns.as_dict(), states, updater_states, scorer_states, batch,
                                  scores == "log-probs", uses_length, history, start_label)
    search_args = dict(beam=beam, blank=blank, sentence_end=sentence_end, max_symbols=max_symbols)
    feats = _utterances(features, utterance_lengths(fns, features, utterances, FRAMES_EXAMPLE), seed)
    refuse_empty_early(kind, torch_scorer, feats, **search_args)
    prove_by_decoding = _loader_and_decode_proof(report, text, len(vocabulary), torch_scorer, feats, search_args)
    parts_report = export_parts(with_steps(kind, parts, maps), folder, states, batch=batch, batch_first=True,
                                exporter=exporter, atol=atol, rtol=rtol, seed=seed, sizes={"frames": FRAMES_EXAMPLE},
                                checks=[prove_by_decoding], extra_files={CONFIG_FILE: text},
                                shared_dims=[FRAMES] if measured.get("frames_sized") else (), progress=progress)
    report.removed = folders.remove_stale(folder, earlier, list(parts_report.files.values()))
    _write_report(report, parts_report, time.perf_counter() - t0)
    return report


def framed_states(states: Sequence, frames_sized: Mapping[str, Sequence[int]]) -> List:
    """The states with each dim measured as the encoder frames renamed to the graphs' encoder-frames dim, so
    the exporters tie it to ``encoder_states``' time axis (the user's StateSpecs are left as they were)."""
    out = []
    for spec in states:
        axes = frames_sized.get(spec.name, ())
        dims = [Dim(FRAMES) if axis in axes else d for axis, d in enumerate(spec.dims)]
        out.append(spec if not axes else StateSpec(spec.name, dims, spec.dtype, spec.output, spec.init))
    return out


def _checked(kind, release, scores, vocabulary, blank, sentence_end, history, features, beam, states,
             updater_states, scorer_states, batch):
    """Every argument a user can get wrong, refused before the minutes of rehearsal and export; the states as
    lists, the ones each graph reads defaulting to all."""
    checks.check_arguments(kind, release, scores, vocabulary, blank, sentence_end, history, features)
    if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
        raise checks.LabelScorerError(f"beam={beam!r}: the proof's beam width, an int >= 1 (it also decodes greedily)",
                                      tensor="beam", rule="beam width")
    states = list(states)
    names = [s.name for s in states]
    updater_states = list(updater_states or names)
    scorer_states = list(scorer_states or names)
    if kind in STATEFUL:
        checks.check_states(states, batch, updater_states, scorer_states, kind)
    return states, updater_states, scorer_states


def _utterances(features, lengths: Sequence[int], seed: int) -> List[np.ndarray]:
    """The proof's utterances: random features ``[1, n, F]`` of each length, from ``seed``."""
    gen = np.random.default_rng(seed)
    return [gen.standard_normal((1, n, features.dims[2])).astype(np.float32) for n in lengths]


def _loader_and_decode_proof(report: LabelScorerReport, text: str, vocabulary_size: int, torch_scorer,
                             feats: Sequence[np.ndarray], search: dict) -> Callable:
    """The check ``export_parts`` runs on the verified graphs before writing them: RASR's loader emulated with
    the config fragment as written, then decodes through the graphs as RASR calls them, against PyTorch's
    decodes. It fills the report's ``loader``, ``decodes``, batched-row figures and ``notes``."""
    kind = report.kind

    def rasr_loads_and_decodes(protos: Dict[str, onnx.ModelProto]) -> None:
        values = config.parse(text)
        report.loader = loader.check(kind, protos, values, vocabulary_size)
        rasr = RasrEmulator(kind, values, graphs=protos)
        report.decodes = prove(kind, rasr, torch_scorer, feats, search["beam"], search["blank"],
                               search["sentence_end"], search["max_symbols"])
        report.row_max_abs_err, report.rows_checked = rasr.row_error, rasr.rows_checked
        report.notes = check_decoded(report.decodes)

    return rasr_loads_and_decodes


def _write_report(report: LabelScorerReport, parts_report, seconds: float) -> None:
    """The parts' summary (graphs, states, steps, files) copied into the report, which is written last beside
    them: a ``report.json`` in the folder means every step passed."""
    summary = parts_report.to_dict()
    report.graphs, report.states, report.files = summary["graphs"], summary["states"], dict(parts_report.files)
    report.steps = summary["steps"]
    report.files["report"] = os.path.join(report.folder, REPORT_FILE)
    report.timings["total"] = seconds
    write_text_atomically(report.files["report"], report.to_json() + "\n")


def _settings(kind: str, blank, sentence_end, history: int, start_label: int):
    """The decoder's own keys, and the search lines the fragment names in comments."""
    if kind == "stateful":
        return {}, ["lexiconfree-labelsync-beam-search", f"sentence-end-label-index = {sentence_end}"]
    settings = {"history-length": str(history), "start-label-index": str(start_label)} if kind == "fixed-context" else {}
    search = ["lexiconfree-timesync-beam-search", f"blank-label-index = {blank}"]
    if kind != "ctc":
        search.append("decoder.vertical-label-transition = true: labels stay on their frame (RNN-T); false: each "
                      "label consumes one (both proven)")
    return settings, search

