"""``onnx-compat export FACTORY|hf:DIR --out model.onnx``: ``export()`` (or ``export_pretrained``) from the command line."""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
from dataclasses import dataclass
from typing import Tuple

from onnx_compat.cli_args import (EXPORTERS, LazyChoices, add_graph_options, add_tolerances, checked_by,
                                  int_at_least, load_examples, load_factory, load_vocabulary, pairs, progress_for,
                                  sizes_for, write_report)
from onnx_compat.cli_paths import Files
from onnx_compat.errors import UsageError
from onnx_compat.huggingface import cli as hf_cli

RUNTIME_HELP = "verify in another runtime too: a venv's python, node:FOLDER with onnxruntime-node, or openvino"


@dataclass(frozen=True)
class FolderContract:
    """A contract whose writer fills a folder (``--out FOLDER``) rather than writing one model: the files it
    writes there, the call that writes it (``module:function``; ``hf`` for a checkpoint folder's ``hf:DIR``), the
    writer's name for the folder, and the options it takes beyond ``--out``/``--json``/``--quiet`` (every other
    option given is a usage error naming it, before any work)."""

    files: Tuple[str, ...]
    writer: str
    folder_keyword: str = "out"
    options: Tuple[str, ...] = ("--exporter", "--no-verify", "--metadata", "--opset", "--atol", "--rtol")

    @property
    def from_checkpoint(self) -> bool:
        return self.writer == "hf"


_TTS = "onnx_compat.parts.sherpa_tts"
_FUNASR = "onnx_compat.parts.funasr"
_COMMON = FolderContract.options

#: contracts that write a folder of graphs rather than one model (``sherpa-onnx/whisper`` from ``hf:DIR``, the
#: others from a ``MODULE:FACTORY`` returning the writer's keyword arguments)
FOLDER_CONTRACTS = {
    "sherpa-onnx/whisper": FolderContract(("encoder.onnx", "decoder.onnx", "tokens.txt"), "hf",
                                          options=_COMMON + ("--language",)),
    "sherpa-onnx/vits": FolderContract(("model.onnx", "tokens.txt", "lexicon.txt"), f"{_TTS}:export_vits"),
    "sherpa-onnx/matcha": FolderContract(("acoustic_model.onnx", "vocoder.onnx", "tokens.txt", "lexicon.txt"),
                                         f"{_TTS}:export_matcha"),
    "sherpa-onnx/nemo-transducer": FolderContract(("encoder.onnx", "decoder.onnx", "joiner.onnx", "tokens.txt"),
                                                  "onnx_compat.parts.nemo_transducer:export_nemo_transducer",
                                                  "folder", ("--exporter", "--no-verify", "--metadata",
                                                             "--vocabulary")),
    "sherpa-onnx/sense-voice": FolderContract(("model.onnx", "tokens.txt"), f"{_FUNASR}:export_sense_voice",
                                              options=_COMMON + ("--language",)),
    "sherpa-onnx/paraformer": FolderContract(("model.onnx", "tokens.txt"), f"{_FUNASR}:export_paraformer"),
}

#: option -> (its ``args`` field, its value when not given); what a folder contract may refuse
OPTIONS = {"--exporter": ("exporter", "auto"), "--no-verify": ("no_verify", False), "--metadata": ("metadata", None),
           "--opset": ("opset", None), "--atol": ("atol", 1e-4), "--rtol": ("rtol", 1e-3),
           "--language": ("language", None), "--vocabulary": ("vocabulary", None), "--size": ("size", None),
           "--strict": ("strict", False), "--rasr": ("rasr", False), "--examples": ("examples", None),
           "--target": ("target", None), "--external-data": ("external_data", None), "--runtime": ("runtime", None),
           "--quantize": ("quantize", None), "--task": ("task", None), "--no-files": ("no_files", False)}
#: options every folder contract takes
FOLDER_OPTIONS = ("--out", "--json", "--quiet", "--contract")


def _contracts():
    from onnx_compat.contracts import CONTRACTS
    return [c.name for c in CONTRACTS] + list(FOLDER_CONTRACTS)


def _recipes():
    from onnx_compat.quantization.recipes import NAMES
    return ["auto", *NAMES]


def _target(text: str) -> None:
    from onnx_compat.pipeline.releases import parse_target
    parse_target(text)


def add_parser(sub) -> argparse.ArgumentParser:
    e = sub.add_parser("export", help="export a model from a factory (or hf:DIR), verify it, write it")
    e.add_argument("factory", help="MODULE:FACTORY, or hf:DIR for a transformers checkpoint folder; for a folder "
                                   "contract (sherpa-onnx/vits, ...) FACTORY returns the writer's keyword arguments")
    e.add_argument("--out", required=True, help="the .onnx file to write (a folder for a folder contract: "
                                                "sherpa-onnx/whisper, vits, matcha, nemo-transducer, sense-voice, "
                                                "paraformer)")
    e.add_argument("--exporter", default="auto", choices=EXPORTERS)
    e.add_argument("--json", help="also write the report as JSON here (no progress lines then)")
    e.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    e.add_argument("--size", action="append", metavar="DIM=N", help="example size of a named dim")
    add_graph_options(e)
    add_tolerances(e)
    e.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime check (not recommended)")
    e.add_argument("--strict", action="store_true", help="baked constants and degenerate outputs are errors")
    e.add_argument("--rasr", action="store_true", help="require RASR's rules to hold")
    e.add_argument("--examples", help="real inputs: FILE.npz (one example) or FILE.pt (a dict or list of dicts)")
    e.add_argument("--target", type=checked_by(_target),
                   help="the ONNX Runtime release the model must load in, e.g. onnxruntime==1.16")
    e.add_argument("--external-data", action="store_true", default=None,
                   help="weights in OUT.data beside the graph (automatic from 1 GiB of weights; less memory)")
    e.add_argument("--runtime", action="append", metavar="PYTHON|node:FOLDER|openvino", help=RUNTIME_HELP)
    e.add_argument("--contract", choices=LazyChoices(_contracts), metavar="NAME",
                   help="a consumer's contract: rasr, sherpa-onnx/nemo-ctc, sherpa-onnx/speaker-embedding, ...; "
                        "hf:DIR also takes sherpa-onnx/whisper, a factory of a family writer's arguments "
                        "sherpa-onnx/vits, matcha, nemo-transducer, sense-voice, paraformer (--out is then a "
                        "folder)")
    e.add_argument("--language", metavar="CODE",
                   help="--contract sherpa-onnx/whisper or sense-voice only: the language the export decodes with "
                        "(checked against the model's; default: Whisper's en or first, SenseVoice's auto)")
    e.add_argument("--vocabulary", help="the contract's tokens, one per line (blank included)")
    e.add_argument("--quantize", choices=LazyChoices(_recipes), metavar="RECIPE",
                   help="write an int8/float16 model, verified against the float one: auto (the fastest recipe "
                        "that meets the thresholds and beats float), int8-dynamic, int8-static, fp16, ... "
                        "(the float model goes beside it)")
    hf_cli.add_arguments(e)
    return e


def files(args: argparse.Namespace) -> Files:
    """Every file this export reads and may write: the model, its weights file (``OUT.data``: asked for, or
    automatic from 1 GiB of weights), the float model beside a quantized one, a contract's files, an
    ``hf:DIR``'s runtime files, the report."""
    out = os.path.abspath(args.out)
    _check_folder_contract(args)
    if args.contract in FOLDER_CONTRACTS:
        return _folder_files(args, out)
    found = Files().read(args.examples, "--examples", "the examples").read(args.vocabulary, "--vocabulary",
                                                                         "the tokens")
    declare_runtimes(found, args.runtime)
    if hf_cli.is_hf_source(args.factory):
        hf_cli.declare_files(args.factory, out, not args.no_files, found)
    found.write(out, "--out", "the ONNX model").write(out + ".data", "--out", "the model's weights file (OUT.data)")
    if args.quantize:
        from onnx_compat.quantization.api import float_path_for
        found.write(float_path_for(out), "--out", "the float model kept beside the quantized one")
    for name in _contract_files(args.contract):
        found.write(os.path.join(os.path.dirname(out), name), "--contract", f"the contract's {name}")
    return found.write(args.json, "--json", "the report")


def _folder_files(args: argparse.Namespace, out: str) -> Files:
    """A folder contract's files: the checkpoint folder it reads (``hf:DIR``), the tokens (``--vocabulary``), the
    folder and each file the writer puts in it (when the folder is there: none may be another of the command's)."""
    spec = FOLDER_CONTRACTS[args.contract]
    found = Files().read(args.vocabulary, "--vocabulary", "the tokens")
    if spec.from_checkpoint:
        hf_cli.declare_files(args.factory, out, False, found)
    found.write(out, "--out", f"the folder of {args.contract}'s files", folder=True)
    if os.path.isdir(out):
        for name in spec.files:
            found.write(os.path.join(out, name), "--out", f"the contract's {name}")
    return found.write(args.json, "--json", "the report")


def _given(args: argparse.Namespace, option: str) -> bool:
    dest, default = OPTIONS[option]
    value = getattr(args, dest)
    return value is not None and value is not False and value != default and value != []


def _check_folder_contract(args: argparse.Namespace) -> None:
    """A folder contract needs its kind of source (``hf:DIR`` for Whisper, ``MODULE:FACTORY`` for the others) and a
    folder for ``--out``; an option its writer does not take (``--language`` without a contract that decodes with
    one, ``--quantize``, ``--size``, ...) is refused naming it: usage errors (exit 2) before any work."""
    spec = FOLDER_CONTRACTS.get(args.contract)
    if args.language is not None and (spec is None or "--language" not in spec.options):
        takers = " or ".join(n for n, c in FOLDER_CONTRACTS.items() if "--language" in c.options)
        raise UsageError(f"--language is for --contract {takers} only", option="--language")
    if spec is None:
        return
    if spec.from_checkpoint != hf_cli.is_hf_source(args.factory):
        source = "a checkpoint folder (hf:DIR)" if spec.from_checkpoint else \
            "MODULE:FACTORY (a function returning the writer's keyword arguments)"
        raise UsageError(f"--contract {args.contract} takes {source}, not {args.factory!r}", option="--contract")
    for option in OPTIONS:
        if option not in spec.options and _given(args, option):
            raise UsageError(f"{option} does not apply to --contract {args.contract} (it takes "
                             f"{', '.join(FOLDER_OPTIONS + spec.options)})", option=option)
    if args.out.endswith(".onnx"):
        raise UsageError(f"--contract {args.contract} writes a folder ({', '.join(spec.files)}): give a folder, not "
                         f"{args.out!r}", option="--out")
    if spec.from_checkpoint:
        _check_whisper_language(args)


def _check_whisper_language(args: argparse.Namespace) -> None:
    """A language the checkpoint lacks is a bad value."""
    folder = args.factory[len(hf_cli.PREFIX):]
    if args.language is not None and os.path.isdir(folder):
        from onnx_compat.contracts.base import ContractError
        from onnx_compat.contracts.sherpa_whisper import choose_language
        from onnx_compat.huggingface.whisper import read_vocabulary
        try:
            choose_language(read_vocabulary(folder), args.language)
        except ContractError as e:
            raise UsageError(f"--language {args.language}: {e.findings[0].expected}, not in {folder}",
                             option="--language") from None


def declare_runtimes(found: Files, runtimes) -> Files:
    """``--runtime``: an interpreter (a path, or a command on PATH) or ``node:FOLDER`` must be there; whether it
    can run ONNX Runtime is the work's to find (exit 1)."""
    for runtime in runtimes or ():
        if runtime == "openvino" or runtime.startswith("openvino:"):
            continue
        if runtime.startswith("node:"):
            found.read(runtime[len("node:"):], "--runtime", "the folder of onnxruntime-node", folder=True)
        else:
            found.read(shutil.which(runtime) or runtime, "--runtime", "the runtime's interpreter")
    return found


def _contract_files(name) -> list:
    """The names of the files the contract ``name`` writes beside the model (sherpa-onnx's tokens.txt)."""
    if name is None or name in FOLDER_CONTRACTS:
        return []
    import onnx
    from onnx_compat.contracts import CONTRACTS
    from onnx_compat.contracts.base import Context
    contract = next(c for c in CONTRACTS if c.name == name)
    return sorted(contract.files(Context(onnx.ModelProto(), [], [], {}, vocabulary=[]))) if contract.files else []


def options(args: argparse.Namespace, progress) -> dict:
    """The ``export()`` keywords the options give, each checked (an output path before any work)."""
    return dict(exporter=args.exporter, metadata=pairs(args.metadata, "--metadata"), opset=args.opset,
                atol=args.atol, rtol=args.rtol, verify=not args.no_verify, strict=args.strict, rasr=args.rasr,
                target=args.target, runtimes=args.runtime or (), external_data=args.external_data,
                progress=progress, contract=args.contract, vocabulary=load_vocabulary(args.vocabulary),
                quantize=args.quantize)


def export_from(args: argparse.Namespace):
    """The export the parsed options ask for, every option checked before any work; the ``Report``."""
    out = os.path.abspath(args.out)
    if args.contract in FOLDER_CONTRACTS and not hf_cli.is_hf_source(args.factory):
        report = export_folder(args, out)
        write_report(args.json, json.dumps(report_dict(report), indent=2, default=str))
        return report
    examples = load_examples(args.examples)
    kwargs = options(args, progress_for(args))
    if args.language is not None:
        kwargs["language"] = args.language
    if hf_cli.is_hf_source(args.factory):
        report = hf_cli.export_hf(args.factory, out, args.task, copy_files=not args.no_files, examples=examples,
                                  sizes=pairs(args.size, "--size", int_at_least(1, "a size")) or None, **kwargs)
    else:
        for flag, given in (("--task", args.task), ("--no-files", args.no_files)):
            if given:
                raise UsageError(f"{flag} is for hf:DIR sources only", option=flag)
        from onnx_compat.api import export
        model, inputs, outputs, factory_examples = load_factory(args.factory)
        report = export(model, out, inputs, outputs, sizes=sizes_for(args.size, inputs),
                        examples=examples or factory_examples, **kwargs)
    write_report(args.json, report.to_json())
    return report


def export_folder(args: argparse.Namespace, out: str):
    """A family writer's folder (``--contract sherpa-onnx/vits``, ...): the factory's keyword arguments, the
    options' over them; the writer's report."""
    import importlib
    spec = FOLDER_CONTRACTS[args.contract]
    module, _, name = spec.writer.partition(":")
    writer = getattr(importlib.import_module(module), name)
    kwargs = writer_arguments(args.factory, args.contract, writer, spec.folder_keyword)
    kwargs.update(_option_arguments(args, spec))
    return writer(**kwargs, **{spec.folder_keyword: out})


def writer_arguments(factory: str, contract: str, writer, folder_keyword: str) -> dict:
    """``FACTORY()``'s dict of the writer's keyword arguments, checked against its signature: a key it does not
    take, one it needs and lacks, or the folder (``--out`` names it) are the factory's error (exit 2)."""
    from onnx_compat.errors import FactoryError
    from onnx_compat.factories import call_factory
    job = call_factory(factory, FactoryError)
    call = f"{writer.__name__}(...)"
    if not isinstance(job, dict):
        raise FactoryError(f"{factory} must return a dict of {call}'s keyword arguments for --contract {contract}, "
                           f"got {type(job).__name__}")
    params = inspect.signature(writer).parameters
    unknown = sorted(k for k in job if k not in params or k == folder_keyword)
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n != folder_keyword
               and n not in job]
    if unknown or missing:
        taken = [n for n in params if n != folder_keyword]
        why = [f"it takes no {unknown}" + (" (--out names the folder)" if folder_keyword in unknown else "")] \
            if unknown else []
        why += [f"it needs {missing}"] if missing else []
        raise FactoryError(f"{factory} returned {sorted(job)} for {call} (--contract {contract}): "
                           f"{'; '.join(why)}; it takes {taken}")
    return dict(job)


def _option_arguments(args: argparse.Namespace, spec: FolderContract) -> dict:
    """The writer's keywords the given options set (over the factory's)."""
    keywords = {"--exporter": ("exporter", lambda v: v), "--no-verify": ("verify", lambda v: not v),
                "--metadata": ("metadata", lambda v: pairs(v, "--metadata")), "--opset": ("opset", lambda v: v),
                "--atol": ("atol", lambda v: v), "--rtol": ("rtol", lambda v: v),
                "--language": ("language", lambda v: v), "--vocabulary": ("vocabulary", load_vocabulary)}
    out = {}
    for option in spec.options:
        if _given(args, option):
            keyword, convert = keywords[option]
            out[keyword] = convert(getattr(args, OPTIONS[option][0]))
    return out


def report_dict(report) -> dict:
    """``--json`` of a family writer's report: its own dict, with the graphs' verification (``parts``) and the
    contract wherever the writer's dict leaves them out (NeMo's)."""
    found = report.to_dict()
    found.setdefault("contract", report.contract)
    found.setdefault("parts", report.parts.to_dict())
    return found


def summary(report, verified: bool = True) -> str:
    """The printed lines of a folder contract's report (Whisper's own; the families': contract, folder, files,
    what each consumer said)."""
    files = "files       " + ", ".join(sorted(os.path.basename(p) for p in report.parts.files.values()))
    if hasattr(report, "summary"):
        return "\n".join([report.summary(), files])
    ran = [f"{c.get('consumer')}: {'ok' if c.get('ok') else c.get('skipped') or 'failed'}"
           for c in report.consumer_checks]
    none = "consumers   " + ("none ran" if verified else "not run (--no-verify)")
    return "\n".join([f"{report.contract}  {report.parts.folder}", files, *(ran or [none])])


def run(args: argparse.Namespace) -> int:
    report = export_from(args)
    if args.contract in FOLDER_CONTRACTS:
        print(summary(report, not args.no_verify))
        return 0
    print(report.summary())
    if hf_cli.is_hf_source(args.factory):
        print("files       " + (", ".join(report.files) or "none"))
    return 0
