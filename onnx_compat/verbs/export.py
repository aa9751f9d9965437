"""``onnx-compat export FACTORY|hf:DIR --out model.onnx``: ``export()`` (or ``export_pretrained``) from the command line."""
from __future__ import annotations

import argparse
import os
import shutil

from onnx_compat.cli_args import (EXPORTERS, LazyChoices, add_graph_options, add_tolerances, checked_by,
                                  int_at_least, load_examples, load_factory, load_vocabulary, pairs, progress_for,
                                  sizes_for, write_report)
from onnx_compat.cli_paths import Files
from onnx_compat.errors import UsageError
from onnx_compat.huggingface import cli as hf_cli

RUNTIME_HELP = "verify in another runtime too: a venv's python, node:FOLDER with onnxruntime-node, or openvino"


#: contracts of a checkpoint folder (``hf:DIR``) that write a folder of graphs rather than one model
FOLDER_CONTRACTS = {"sherpa-onnx/whisper": ("encoder.onnx", "decoder.onnx", "tokens.txt")}


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
    e.add_argument("factory", help="MODULE:FACTORY, or hf:DIR for a transformers checkpoint folder")
    e.add_argument("--out", required=True, help="the .onnx file to write (a folder for --contract sherpa-onnx/whisper)")
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
                        "hf:DIR also takes sherpa-onnx/whisper (--out is then a folder)")
    e.add_argument("--language", metavar="CODE",
                   help="--contract sherpa-onnx/whisper only: the language the export decodes with (checked against "
                        "the model's; default en, or the model's first)")
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
        found = Files()
        hf_cli.declare_files(args.factory, out, False, found)
        found.write(out, "--out", f"the folder of {args.contract}'s files", folder=True)
        if os.path.isdir(out):  # its files, each a file that must not be another of the command's
            for name in FOLDER_CONTRACTS[args.contract]:
                found.write(os.path.join(out, name), "--out", f"the contract's {name}")
        return found.write(args.json, "--json", "the report")
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


def _check_folder_contract(args: argparse.Namespace) -> None:
    """A folder contract needs an ``hf:DIR`` source; ``--language`` needs a folder contract: usage errors (exit 2)
    before any work."""
    if args.contract in FOLDER_CONTRACTS and not hf_cli.is_hf_source(args.factory):
        raise UsageError(f"--contract {args.contract} takes a checkpoint folder (hf:DIR), not {args.factory!r}",
                         option="--contract")
    if args.language is not None and args.contract not in FOLDER_CONTRACTS:
        raise UsageError("--language is for --contract sherpa-onnx/whisper only", option="--language")
    folder = args.factory[len(hf_cli.PREFIX):]
    if args.language is not None and os.path.isdir(folder):  # a language the checkpoint lacks is a bad value
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


def run(args: argparse.Namespace) -> int:
    report = export_from(args)
    print(report.summary())
    if hf_cli.is_hf_source(args.factory):
        print("files       " + (", ".join(report.files) or "none"))
    return 0
