"""One exit-code rule for every verb and every bad value (docs/cli.md, "Exit codes"; ``cli.EXIT_CODES``).

Each verb of ``cli.VERBS`` is walked through its bad values: an unknown choice, a number out of range, an input
that is not there, an output that cannot be written, an output that is another file of the same command. Each
is exit 2, one line ``onnx-compat: usage error: ...``, found before any work, with every file of the folder as
it was (issue 45: ``--json`` equal to ``--out`` wrote the report over the verified model and exited 0;
``quantize --json`` could overwrite the float model; ``--json /proc/a.json`` failed after the export had
written its model; ``--beam 0``, ``--measure bogus`` and ``hf:MISSING`` exited 1).

In-process ``onnx_compat.cli.main`` calls; one TorchScript export of the demo model is shared by the module.
"""
import argparse
import hashlib
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from onnx_compat.cli import EXIT_CODES, FAILED, INTERRUPTED, USAGE, VERBS, _parser, exit_code, main

ROOT = Path(__file__).resolve().parent.parent
FACTORY = "onnx_compat.models.conv_demo:build"
STREAMING = "onnx_compat.models.lstm_encoder:streaming_job"
SCORER = "onnx_compat.models.aed:ctc_label_scorer_job"
JOBS = "onnx_compat.models.label_scorer_jobs"
SHERPA = "onnx_compat.models.sherpa_jobs"
_COMBINED = ["--combine", f"{JOBS}:transformer_aed=1", "--combine", f"{JOBS}:transformer_lm=0.3"]


@pytest.fixture(scope="module")
def proven(tmp_path_factory):
    """A verified float model and its report (export --json), made once."""
    folder = tmp_path_factory.mktemp("proven")
    assert main(["export", FACTORY, "--out", str(folder / "m.onnx"), "--exporter", "torchscript",
                 "--json", str(folder / "r.json")]) == 0
    return folder


@pytest.fixture
def work(proven, tmp_path, monkeypatch):
    """A folder holding m.onnx and r.json (copies), the current directory of the command."""
    for name in ("m.onnx", "r.json"):
        shutil.copy(proven / name, tmp_path / name)
    (tmp_path / "a_folder").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _state(folder: Path) -> dict:
    """Every file under ``folder`` with its content's hash: what "nothing touched" compares."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _refused(argv, folder: Path, capsys, match: str) -> str:
    before = _state(folder)
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == USAGE, f"{argv}: exit {code}, {err}"
    assert err.startswith("onnx-compat: usage error: ") and len(err.splitlines()) == 1, err
    assert match in err, err
    assert _state(folder) == before, "a refused command touches nothing"
    return err


# verb -> (argv after the verb, what the one line says); every verb of cli.VERBS has its bad values here
BAD_VALUES = {
    "export": [
        ([FACTORY, "--out", "m2.onnx", "--exporter", "bogus"], "invalid choice: 'bogus'"),
        ([FACTORY, "--out", "m2.onnx", "--opset", "0"], "argument --opset: 0 is not an ONNX opset"),
        ([FACTORY, "--out", "m2.onnx", "--opset", "99"], "argument --opset: 99 is not an ONNX opset: onnx"),
        ([FACTORY, "--out", "m2.onnx", "--runtime", "/no/python"], "--runtime: no such file '/no/python'"),
        ([FACTORY, "--out", "m2.onnx", "--atol", "-1"], "argument --atol"),
        ([FACTORY, "--out", "m2.onnx", "--rtol", "nan"], "argument --rtol"),
        ([FACTORY, "--out", "m2.onnx", "--size", "time=0"], "--size 'time=0': 0 is not a size"),
        ([FACTORY, "--out", "m2.onnx", "--target", "onnxruntime==9.9"], "no measured row for onnxruntime 9.9"),
        ([FACTORY, "--out", "m2.onnx", "--target", "tensorrt"], "unknown target 'tensorrt'"),
        ([FACTORY, "--out", "m2.onnx", "--contract", "nope"], "invalid choice: 'nope'"),
        ([FACTORY, "--out", "m2.onnx", "--quantize", "nope"], "invalid choice: 'nope'"),
        (["no_such_module:build", "--out", "m2.onnx"], "cannot import 'no_such_module'"),
        (["hf:MISSING", "--out", "m2.onnx"], "hf:DIR: no such folder"),
        ([FACTORY, "--out", "m2.onnx", "--examples", "missing.npz"], "--examples: no such file"),
        ([FACTORY, "--out", "m2.onnx", "--vocabulary", "missing.txt"], "--vocabulary: no such file"),
        ([FACTORY, "--out", "a_folder"], "--out: cannot write the ONNX model to"),
        ([FACTORY, "--out", "no/m2.onnx"], "does not exist"),
        ([FACTORY, "--out", "m2.onnx", "--json", "/proc/a.json"], "--json: cannot write the report to '/proc/a.json'"),
        ([FACTORY, "--out", "m2.onnx", "--json", "/dev/null"], "not a regular file"),
        ([FACTORY, "--out", "d.onnx", "--json", "d.onnx"], "--json '{work}/d.onnx' is the file --out writes"),
        ([FACTORY, "--out", "m.onnx", "--json", "m.onnx.data"], "the model's weights file"),
        ([FACTORY, "--out", "q.onnx", "--quantize", "fp16", "--json", "q.float.onnx"], "the float model kept beside"),
        ([FACTORY, "--out", "m2.onnx", "--contract", "sherpa-onnx/nemo-ctc", "--vocabulary", "r.json", "--json",
          "tokens.txt"], "is the file --contract writes (the contract's tokens.txt)"),
        # the family writers' folder contracts (sherpa-onnx/vits, ...): the walk over every option is below
        ([f"{SHERPA}:vits", "--contract", "sherpa-onnx/vits", "--out", "voice", "--quantize", "fp16"],
         "--quantize does not apply to --contract sherpa-onnx/vits"),
        ([f"{SHERPA}:vits", "--contract", "sherpa-onnx/vits", "--out", "voice.onnx"],
         "--contract sherpa-onnx/vits writes a folder (model.onnx, tokens.txt, lexicon.txt)"),
        ([f"{SHERPA}:vits", "--contract", "sherpa-onnx/vits", "--out", "r.json"], "a file is there, not a folder"),
        ([f"{SHERPA}:vits", "--contract", "sherpa-onnx/matcha", "--out", "voice"],
         "it needs ['acoustic', 'vocoder', 'vocoder_type']"),
        ([FACTORY, "--contract", "sherpa-onnx/sense-voice", "--out", "sv"], "for export_sense_voice(...)"),
        ([f"{SHERPA}:no_such", "--contract", "sherpa-onnx/paraformer", "--out", "p"], "no callable 'no_such'"),
        (["hf:ckpt", "--contract", "sherpa-onnx/vits", "--out", "voice"], "takes MODULE:FACTORY"),
        ([f"{SHERPA}:nemo_rnnt", "--contract", "sherpa-onnx/nemo-transducer", "--out", "t", "--opset", "17"],
         "--opset does not apply to --contract sherpa-onnx/nemo-transducer"),
        ([f"{SHERPA}:paraformer", "--contract", "sherpa-onnx/paraformer", "--out", "p", "--language", "en"],
         "--language is for --contract sherpa-onnx/whisper or sherpa-onnx/sense-voice only"),
        ([f"{SHERPA}:nemo_rnnt", "--contract", "sherpa-onnx/nemo-transducer", "--out", "t", "--vocabulary",
          "missing.txt"], "--vocabulary: no such file"),
        ([f"{SHERPA}:matcha", "--contract", "sherpa-onnx/matcha", "--out", "a_folder", "--json",
          "a_folder/vocoder.onnx"], "is the file --out writes (the contract's vocoder.onnx)"),
    ],
    "verify": [
        (["missing.onnx", FACTORY], "onnx: no such file"),
        (["m.onnx", FACTORY, "--atol", "x"], "argument --atol: 'x' is not a number"),
        (["m.onnx", FACTORY, "--examples", "x.npz"], "--examples: no such file"),
        (["m.onnx", FACTORY, "--examples", "r.json"], "--examples takes a .npz or .pt file"),
        (["m.onnx", "no_such_module:build"], "cannot import 'no_such_module'"),
        (["m.onnx", FACTORY, "--runtime", "node:no_folder"], "--runtime: no such folder"),
        (["m.onnx", FACTORY, "--json", "./m.onnx"], "--json '{work}/m.onnx' is the file onnx reads (the model checked)"),
    ],
    "diagnose": [
        ([FACTORY, "--exporter", "auto"], "invalid choice: 'auto'"),
        ([FACTORY, "--size", "frames=3"], "no input has a dim named 'frames'"),
        ([FACTORY, "--examples", "missing.pt"], "--examples: no such file"),
        ([FACTORY, "--rtol", "-0.5"], "argument --rtol"),
    ],
    "inspect": [
        (["missing.onnx"], "onnx: no such file"),
        (["m.onnx", "--dynamic", "nosuch:1"], "'nosuch'"),
        (["m.onnx", "--dynamic", "data"], "expected NAME:AXIS"),
    ],
    "repair": [
        (["missing.onnx", "--out", "f.onnx"], "onnx: no such file"),
        (["m.onnx", "--out", "no/f.onnx"], "--out: cannot write the repaired model"),
        (["m.onnx", "--out", "m.onnx"], "is the file onnx reads (the model repaired)"),
    ],
    "export-streaming": [
        ([STREAMING, "--out", "s.onnx", "--chunks", "4"], "argument --chunks: 4 is not a stream length: at least 5"),
        ([STREAMING, "--out", "s.onnx", "--batch", "0"], "argument --batch: 0 is not a batch size"),
        ([STREAMING, "--out", "s.onnx", "--max-drift", "0"], "argument --max-drift"),
        ([STREAMING, "--out", "s.onnx", "--opset", "3"], "argument --opset"),
        ([STREAMING, "--out", "s.onnx", "--json", "s.onnx"], "--json '{work}/s.onnx' is the file --out writes"),
        ([STREAMING, "--out", "a_folder"], "it is a directory"),
    ],
    "quantize": [
        (["m.onnx", FACTORY, "--report", "r.json", "--measure", "bogus"], "argument --measure: unknown measure"),
        (["m.onnx", FACTORY, "--report", "r.json", "--measure", "output=bogus"], "unknown measure 'bogus'"),
        (["m.onnx", FACTORY, "--report", "r.json", "--recipe", "bogus"], "invalid choice: 'bogus'"),
        (["m.onnx", FACTORY, "--report", "r.json", "--target", "tensorrt"], "argument --target"),
        (["m.onnx", FACTORY, "--report", "r.json", "--exclude-limit", "-1"], "argument --exclude-limit"),
        (["m.onnx", FACTORY, "--report", "r.json", "--threshold", "snr"], "--threshold takes KEY=VALUE"),
        (["m.onnx", FACTORY, "--report", "r.json", "--threshold", "nosuch=1"], "--threshold: thresholds ['nosuch']"),
        (["m.onnx", FACTORY, "--report", "r.json", "--measure", "nosuch=snr"], "--measure: measures name output(s)"),
        (["m.onnx", FACTORY, "--report", "missing.json"], "--report: no such file"),
        (["m.onnx", FACTORY, "--report", "r.json", "--recipe", "fp16", "--json", "m.onnx"],
         "--json '{work}/m.onnx' is the file onnx reads (the float model)"),
        (["m.onnx", FACTORY, "--report", "r.json", "--recipe", "fp16", "--out", "m.onnx"],
         "--out '{work}/m.onnx' is the file onnx reads (the float model)"),
        (["m.onnx", FACTORY, "--report", "r.json", "--json", "r.json"], "is the file --report reads"),
        (["m.onnx", FACTORY, "--report", "r.json", "--recipe", "fp16", "--json", "m.fp16.onnx"],
         "is the file --out writes (the quantized model)"),
    ],
    "label-scorer": [
        ([SCORER, "--out", "ls", "--beam", "0"], "argument --beam: 0 is not a beam width: at least 1"),
        ([SCORER, "--out", "ls", "--utterances", "7,x"], "--utterances takes comma-separated"),
        ([SCORER, "--out", "ls", "--utterances", "0"], "of at least 1"),
        ([SCORER, "--out", "ls", "--exporter", "bogus"], "invalid choice: 'bogus'"),
        ([SCORER, "--out", "ls", "--release", "bogus"], "invalid choice: 'bogus'"),
        ([SCORER, "--out", "m.onnx"], "a file is there, not a folder"),
        ([SCORER, "--out", "no/ls"], "does not exist"),
        (["onnx_compat.models.aed:no_such_job", "--out", "ls"], "no callable 'no_such_job'"),
        ([SCORER, "--out", "ls", "--manager", "bogus"], "invalid choice: 'bogus'"),
        ([SCORER, "--out", "ls", "--manager", "transformer"], "--manager is for kind='state-managed'"),
        ([SCORER, "--out", "ls", "--release", "full-context-pr"], "written for master or transducer-pr"),
        ([f"{JOBS}:transformer_lm", "--out", "ls", "--release", "transducer-pr"], "pass --release master"),
        ([f"{JOBS}:transformer_lm_full_context", "--out", "ls"], "pass --release full-context-pr"),
        ([f"{JOBS}:transformer_lm_full_context", "--out", "ls", "--release", "master"], "pass --release full-cont"),
        (["onnx_compat.models.transducer:label_scorer_job", "--out", "ls", "--release", "master"],
         "pass --release transducer-pr"),
        (["--out", "ls"], "not neither"),
        ([SCORER, "--combine", f"{JOBS}:transformer_lm=1", "--combine", f"{JOBS}:transformer_aed=1", "--out", "ls"],
         "not both"),
        (["--combine", f"{JOBS}:transformer_aed", "--out", "ls"], "argument --combine: takes FACTORY=SCALE"),
        (["--combine", f"{JOBS}:transformer_aed=0", "--out", "ls"], "argument --combine: 0 is not a finite number"),
        (["--combine", f"{JOBS}:transformer_aed=inf", "--out", "ls"], "argument --combine"),
        (["--combine", f"{JOBS}:transformer_aed=1", "--out", "ls"], "--combine takes at least two scorers"),
        (_COMBINED + ["--out", "ls", "--manager", "transformer"], "--manager is for one scorer"),
        (_COMBINED + ["--out", "ls", "--release", "master"], "--release is for one scorer"),
        (_COMBINED + ["--out", "a_folder"], "exists: a combination is written into a new folder"),
        (["--combine", f"{JOBS}:transformer_lm=1", "--combine", f"{JOBS}:lstm_lm=0.5", "--out", "ls"],
         "--combine: the scorers are ['lm', 'lm']: exactly one AED"),
        (["--combine", f"{JOBS}:transducer=1", "--combine", f"{JOBS}:transformer_lm=0.3", "--out", "ls"],
         "--combine: the scorers' vocabularies have [12, 10] labels"),
        (["--combine", "no_such_module:job=1", "--combine", f"{JOBS}:transformer_lm=1", "--out", "ls"],
         "cannot import 'no_such_module'"),
    ],
}
CASES = [(verb, argv, match) for verb, cases in BAD_VALUES.items() for argv, match in cases]


def test_every_verb_has_its_bad_values_walked():
    assert set(BAD_VALUES) == set(VERBS), "a verb without bad values here: add its row"


@pytest.mark.parametrize("verb, argv, match", CASES, ids=[f"{v}:{' '.join(a[1:])[:40]}" for v, a, _ in CASES])
def test_a_bad_value_is_exit_2_before_any_work(verb, argv, match, work, capsys):
    if "/proc/" in " ".join(argv) and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    _refused([verb, *argv], work, capsys, match.format(work=work))


# an option's value that counts as given (not its default), for the walk of the folder contracts
GIVEN = {"--exporter": ["torchscript"], "--no-verify": [], "--metadata": ["a=b"], "--opset": ["17"],
         "--atol": ["0.5"], "--rtol": ["0.5"], "--language": ["en"], "--vocabulary": ["r.json"],
         "--size": ["time=3"], "--strict": [], "--rasr": [], "--examples": ["x.npz"],
         "--target": ["onnxruntime==1.16"], "--external-data": [], "--runtime": ["openvino"],
         "--quantize": ["fp16"], "--task": ["ctc"], "--no-files": []}


def _folder_refusals():
    from onnx_compat.verbs.export import FOLDER_CONTRACTS
    for name, spec in FOLDER_CONTRACTS.items():
        source = "hf:ckpt" if spec.from_checkpoint else f"{SHERPA}:vits"
        for option, value in GIVEN.items():
            if option not in spec.options:
                yield name, [source, "--contract", name, "--out", "folder", option, *value], option


def test_every_export_option_is_walked_for_the_folder_contracts():
    """Each option of ``export`` is one every folder contract takes, or one the walk below gives to each folder
    contract that does not take it: a new option joins the walk (or the refusal is not checked)."""
    from onnx_compat.verbs.export import FOLDER_OPTIONS, OPTIONS
    assert set(GIVEN) == set(OPTIONS)
    assert _options("export") == set(OPTIONS) | set(FOLDER_OPTIONS) | {"-h", "--help"}


@pytest.mark.parametrize("contract, argv, option", list(_folder_refusals()),
                         ids=[f"{c}:{o}" for c, _, o in _folder_refusals()])
def test_an_option_a_folder_contract_does_not_take_is_exit_2(contract, argv, option, work, capsys):
    """``--quantize`` (or ``--size``, ``--opset`` for NeMo, ...) with a family writer's contract: refused naming
    the option, before the factory runs, nothing written."""
    _refused(["export", *argv], work, capsys, option)


def test_json_equal_to_out_never_destroys_the_model(work, capsys):
    """Finding 1: ``--out d.onnx --json d.onnx`` exited 0, said "verified", and d.onnx held the report. Every
    spelling of one file collides (./d.onnx, a symlink, a hard link), and an earlier model there is kept."""
    shutil.copy(work / "m.onnx", work / "d.onnx")
    os.symlink(work / "d.onnx", work / "link.onnx")
    os.link(work / "d.onnx", work / "hard.onnx")
    for json_path in ("d.onnx", "./d.onnx", str(work / "a_folder" / ".." / "d.onnx"), "link.onnx", "hard.onnx"):
        _refused(["export", FACTORY, "--out", "d.onnx", "--exporter", "torchscript", "--json", json_path], work,
                 capsys, "is the file --out writes (the ONNX model)")


def test_quantize_json_never_overwrites_the_float_model(work, capsys):
    """Finding 2: ``--out`` equal to the float model was refused (after loading, exit 1), ``--json`` was not;
    the docs promise the float model is never written to."""
    for option in ("--json", "--out"):
        _refused(["quantize", "m.onnx", FACTORY, "--recipe", "fp16", "--report", "r.json", option, "./m.onnx"],
                 work, capsys, "is the file onnx reads (the float model)")


def test_a_checkpoint_folders_files_are_outputs_too(work, capsys):
    """``export hf:DIR`` copies the checkpoint's runtime files beside the model: --json must not be one of them,
    nor one of the checkpoint's own files; exporting into the checkpoint folder copies nothing onto itself."""
    (work / "ckpt").mkdir()
    (work / "ckpt" / "config.json").write_text("{}")
    _refused(["export", "hf:ckpt", "--out", "m2.onnx", "--json", "config.json"], work, capsys,
             "is the file --out writes (the checkpoint's config.json copied beside the model)")
    _refused(["export", "hf:ckpt", "--out", "m2.onnx", "--json", "ckpt/config.json"], work, capsys,
             "is the file hf:DIR reads (the checkpoint's config.json)")
    _refused(["export", "hf:ckpt", "--out", "ckpt/m.onnx", "--json", "ckpt/config.json"], work, capsys,
             "is the file hf:DIR reads")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_an_output_the_folder_refuses_is_found_before_the_export(work, capsys):
    """Finding 12: /proc passed the folder check (root may write anywhere, says os.access), the export wrote its
    model, then a raw FileNotFoundError exited 1."""
    _refused(["export", FACTORY, "--out", "m2.onnx", "--exporter", "torchscript", "--json", "/proc/a.json"], work,
             capsys, "--json: cannot write the report to '/proc/a.json'")
    assert not (work / "m2.onnx").exists()


@pytest.mark.parametrize("argv, match", [
    (["label-scorer", SCORER, "--out", "ls", "--beam", "0"], "--beam"),
    (["quantize", "m.onnx", FACTORY, "--recipe", "fp16", "--report", "r.json", "--measure", "bogus"], "--measure"),
    (["export", "hf:MISSING", "--out", "h.onnx"], "hf:DIR"),
], ids=["beam_0", "measure_bogus", "hf_missing"])
def test_bad_values_that_exited_1_exit_2(argv, match, work, capsys):
    """Finding 12: these reached the library and exited 1, while --recipe bogus and a missing FACTORY exit 2."""
    _refused(argv, work, capsys, match)


def test_the_exit_code_table_is_the_one_rule():
    from onnx_compat.errors import ArgumentError, FactoryError, ModelFileError, OutputPathError, UsageError
    assert [exit_code(e) for e in (UsageError("x"), FactoryError("x"), ArgumentError("x"), OutputPathError("x"))] \
        == [USAGE] * 4
    assert [exit_code(e) for e in (ModelFileError("x"), RuntimeError("x"), OSError("x"))] == [FAILED] * 3
    assert exit_code(KeyboardInterrupt()) == INTERRUPTED
    assert [code for _, code in EXIT_CODES] == [INTERRUPTED, USAGE, FAILED]


def _exit_code_rows() -> dict:
    """docs/cli.md's exit-code table by verb: ``{verb: (what exits 2, what exits 1)}``."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`([\w-]+)`", cells[0]) if len(cells) == 3 else None
        if found:
            rows[found.group(1)] = (cells[1], cells[2])
    return rows


def test_the_docs_exit_code_table_covers_every_verb():
    rows = _exit_code_rows()
    assert set(rows) == set(VERBS), f"docs/cli.md's exit-code table: {sorted(rows)} against {sorted(VERBS)}"
    for verb, (usage, failed) in rows.items():
        options = {o for o in re.findall(r"--[\w-]+", usage)}
        known = _options(verb)
        assert options <= known, f"docs/cli.md names options {verb} does not have: {sorted(options - known)}"
        assert usage and failed, verb


def _options(verb: str) -> set:
    """The option strings ``verb``'s parser takes."""
    sub = next(a for a in _parser(verb)._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices[verb]._actions for o in a.option_strings}


def _doc_commands():
    """Every ``onnx-compat VERB ...`` line of docs/cli.md's plain blocks, continuation lines joined."""
    text = (ROOT / "docs" / "cli.md").read_text()
    blocks = re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith("onnx-compat "):
                yield command


def test_the_docs_commands_name_verbs_and_options_that_exist():
    commands = list(_doc_commands())
    assert commands, "docs/cli.md shows no command"
    for command in commands:
        words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
        verb = words[1]
        assert verb in VERBS, command
        known = _options(verb)
        unknown = [w for w in words if w.startswith("--") and w not in known]
        assert not unknown, f"docs/cli.md: `{command[:60]}...` has options {verb} does not take: {unknown}"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_the_library_tries_the_folder_too(tmp_path):
    """``export()`` checks its path with the same trial as the command (``pipeline.files.refuses_a_file``):
    ``os.access`` says yes to root in /proc, and the export ran before the write failed."""
    import torch
    from onnx_compat import Dim, TensorSpec, export
    from onnx_compat.errors import OutputPathError
    with pytest.raises(OutputPathError, match="folder '/proc' is not writable"):
        export(torch.nn.Linear(3, 2), "/proc/m.onnx", [TensorSpec("x", [Dim("batch"), 3])],
               [TensorSpec("y", [Dim("batch"), 2])], exporter="torchscript")
