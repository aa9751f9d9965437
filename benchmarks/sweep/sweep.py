"""The wide sweep: third-party audio/speech models nobody here has looked at, each exported
five ways (vanilla TorchScript and dynamo, both again under ``onnx_compat.patched()``, and
``onnx_compat.export(exporter="auto")``), one subprocess per model with a timeout.

Not part of CI: it needs the libraries of ``sweep_models.py`` beside torch, in a scratch venv that
``make_env.sh`` (beside this file) builds:

    benchmarks/sweep/make_env.sh /work/scratch/sweep/venv && V=/work/scratch/sweep/venv/bin
    taskset -c 1 $V/python benchmarks/sweep/sweep.py --write docs/sweep.md --json docs/sweep.json
    $V/python benchmarks/sweep/sweep.py --only julius_lowpass --steps vanilla_ts,auto   # a quick look at one model
    $V/python benchmarks/sweep/sweep.py --round 2 --json after.json --before docs/sweep2_first.json --write docs/sweep.md

``--round 2`` runs the second round's models (``sweep_models2.py``) and writes their own block of the page;
``--before`` puts a first-contact run beside this one.

``--only`` runs models whose name contains the text; a model whose library is not installed
shows as "does not build". The patterns are named by ``sweep_patterns.py`` from each error.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Dict, List, Optional

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/sweep.md", "needs": "`benchmarks/sweep/make_env.sh`",
             "args": ["--write", "docs/sweep.md", "--json", "docs/sweep.json"]}

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from sweep_models import ENTRIES  # noqa: E402
from sweep_patterns import classify  # noqa: E402
from sweep_run import STEPS  # noqa: E402

COLUMNS = (("vanilla_ts", "vanilla TS"), ("vanilla_dynamo", "vanilla dynamo"), ("patched_ts", "patched TS"),
           ("patched_dynamo", "patched dynamo"), ("auto", "export(auto)"))
_ONE_CORE = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def run_model(name: str, steps, timeout: float) -> dict:
    """One model, each step bounded by ``timeout``: a hung step is killed (its process group) and marked,
    and a fresh process runs the steps after it, so one hang does not hide the other outcomes."""
    result: dict = {"model": name, "steps": {}}
    remaining = list(steps)
    while remaining:
        part = _spawn(name, remaining, timeout)
        result["steps"].update(part.get("steps", {}))
        if "build" in part:
            result["build"] = part["build"]
            break
        remaining = [s for s in remaining if s not in result["steps"]]
    entry = ENTRIES[name]
    result.update(model=name, library=entry.library, kind=entry.kind)
    classify(result)
    return result


def _spawn(name: str, steps, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path, err_path = os.path.join(tmp, "result.json"), os.path.join(tmp, "stderr")
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, os.path.join(HERE, "sweep_run.py"), name, path, ",".join(steps)],
                                    env={**os.environ, **_ONE_CORE}, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
            ended = _watch(proc, path, timeout)
        result = _load(path) or {"model": name, "steps": {}, "running": steps[0]}
        with open(err_path) as f:
            tail = [ln for ln in f.read().splitlines() if ln.strip()][-1:]
    running = result.pop("running", None)
    if running:
        result["steps"][running] = {"stage": "timeout" if ended else "crash",
                                    "error": ended or (tail[0] if tail else f"exit {proc.returncode}")}
    elif proc.returncode and "build" not in result and not result["steps"]:
        result["build"] = {"error": tail[0] if tail else f"exit {proc.returncode}"}
    return result


def _watch(proc: subprocess.Popen, path: str, timeout: float):
    """Wait for the child; kill its process group when one step has run longer than ``timeout``."""
    step, since = None, time.monotonic()
    while proc.poll() is None:
        time.sleep(1)
        running = (_load(path) or {}).get("running")
        if running != step:
            step, since = running, time.monotonic()
        elif time.monotonic() - since > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timeout after {timeout:.0f}s"
    return None


def _load(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_CELL = {"ok": "ok", "export": "export ✗", "dims": "dim baked", "load": "load ✗", "run": "ORT ✗ new shape",
         "numbers": "wrong numbers", "eager": "eager ✗", "timeout": "timeout", "crash": "crash", "failed": "✗"}


def cell(outcome) -> str:
    if outcome is None:
        return "–"
    if outcome["stage"] == "ok" and "exporter" in outcome:
        return f"ok ({outcome['exporter']})"
    if outcome["stage"] == "numbers" and "has shape" in outcome.get("error", ""):
        return "wrong shape"
    return _CELL.get(outcome["stage"], outcome["stage"])


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


PLAIN_STEPS = ("vanilla_ts", "vanilla_dynamo", "patched_ts", "patched_dynamo")


def auto_at_least_steps(row: dict) -> str:
    """Issue #47's property for one row, from its recorded steps: ``export(auto)`` verifies every model that one of
    the four plain steps verifies. "yes" (auto verified, or no step did), "no (steps)" naming the steps that
    verified where auto did not, "–" when a step is missing (not run) and none of the others settles it."""
    if "build" in row:
        return "–"
    steps = row.get("steps", {})
    if steps.get("auto", {}).get("stage") == "ok":
        return "yes"
    verified = [s for s in PLAIN_STEPS if steps.get(s, {}).get("stage") == "ok"]
    if verified:
        return "no (" + ", ".join(verified) + ")"
    return "yes" if "auto" in steps and all(s in steps for s in PLAIN_STEPS) else "–"


def table(rows: List[dict]) -> str:
    lines = ["| model | library | kind | " + " | ".join(title for _, title in COLUMNS)
             + " | auto ≥ steps | pattern |",
             "|" + "---|" * (len(COLUMNS) + 5)]
    for r in rows:
        if "build" in r:
            cells = ["does not build"] * len(COLUMNS)
        else:
            cells = [cell(r["steps"].get(step)) for step, _ in COLUMNS]
        lines.append("| " + " | ".join(_md(c) for c in [r["model"], r["library"], r["kind"], *cells,
                                                          auto_at_least_steps(r),
                                                          "; ".join(r.get("patterns", [])) or "–"]) + " |")
    return "\n".join(lines)


def property_line(rows: List[dict]) -> str:
    """The property over the rows: on how many built models it holds, and the models where it does not."""
    built = [r for r in rows if "build" not in r]
    cells = {r["model"]: auto_at_least_steps(r) for r in built}
    failing = [m for m, c in cells.items() if c.startswith("no")]
    unknown = [m for m, c in cells.items() if c == "–"]
    return (f"- auto ≥ steps (export(auto) verifies every model a plain or patched step verifies): holds on "
            f"{sum(c == 'yes' for c in cells.values())}/{len(built)}"
            + (f"; fails on {', '.join(failing)}" if failing else "")
            + (f"; not settled (steps missing) on {', '.join(unknown)}" if unknown else ""))


def errors_table(rows: List[dict]) -> str:
    """Every failing step's one-line error and the library line it came from."""
    lines = ["| model | step | error | library line |", "|---|---|---|---|"]
    for r in rows:
        for step, _ in COLUMNS:
            o = r.get("steps", {}).get(step)
            if not o or o["stage"] == "ok":
                continue
            errors = o.get("attempts") or {"": o.get("error", "")}
            for exporter, error in errors.items():
                what = f"{step} ({exporter})" if exporter else step
                where = o.get("where") or ("baked at " + ", ".join(o["baked_at"]) if o.get("baked_at") else "")
                lines.append(f"| {r['model']} | {what} | {_md(_short(error, 220))} | {_md(where)} |")
    return "\n".join(lines)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def pattern_counts(rows: List[dict]) -> Dict[str, Counter]:
    """Per pattern: models it stops in export(auto), and models where it stops a vanilla exporter."""
    counts: Dict[str, Counter] = {}
    for r in rows:
        for pattern, where in r.get("pattern_steps", {}).items():
            c = counts.setdefault(pattern, Counter())
            c["models"] += 1
            c["auto"] += any(s.startswith("auto:") or s == "auto" for s in where)
            c["vanilla"] += any(s.startswith("vanilla") for s in where)
            c["patched"] += any(s.startswith("patched") for s in where)
    return counts


def summary(rows: List[dict]) -> str:
    built = [r for r in rows if "build" not in r]
    passed = [r for r in built if r["steps"].get("auto", {}).get("stage") == "ok"]
    libraries = sorted({r["library"] for r in rows})
    vanilla = [r for r in built if any(r["steps"].get(s, {}).get("stage") == "ok" for s in ("vanilla_ts", "vanilla_dynamo"))]
    patched = [r for r in built if any(r["steps"].get(s, {}).get("stage") == "ok" for s in ("patched_ts", "patched_dynamo"))]
    lines = [f"{len(rows)} models from {len(libraries)} libraries; {len(built)} build.",
             f"- export(auto) verified: **{len(passed)}/{len(built)}** ({100 * len(passed) / max(len(built), 1):.0f} %)",
             f"- some vanilla exporter verified: {len(vanilla)}/{len(built)}",
             f"- some exporter verified under `patched()` alone: {len(patched)}/{len(built)}"]
    return "\n".join(lines)


def ranking(rows: List[dict]) -> str:
    counts = pattern_counts(rows)
    order = sorted(counts, key=lambda p: (-counts[p]["auto"], -counts[p]["models"], p))
    lines = ["| pattern | models stopped in export(auto) | models where it fails some exporter | vanilla | patched |",
             "|---|---|---|---|---|"]
    for p in order:
        c = counts[p]
        lines.append(f"| {p} | {c['auto']} | {c['models']} | {c['vanilla']} | {c['patched']} |")
    return "\n".join(lines)


def _ok(row: dict, step: str) -> bool:
    return "build" not in row and row.get("steps", {}).get(step, {}).get("stage") == "ok"


def exporter_figures(rows: List[dict]) -> str:
    """Per exporter, how many models verify plainly and inside ``patched()``; and every model where one side
    verifies and the other does not (the issue's property: patched never below vanilla)."""
    built = [r for r in rows if "build" not in r]
    lines = []
    for name, plain, patched in (("TorchScript", "vanilla_ts", "patched_ts"),
                                 ("dynamo", "vanilla_dynamo", "patched_dynamo")):
        worse = [r["model"] for r in built if _ok(r, plain) and not _ok(r, patched)]
        better = [r["model"] for r in built if _ok(r, patched) and not _ok(r, plain)]
        lines.append(f"- {name}: vanilla {sum(_ok(r, plain) for r in built)}/{len(built)}, patched "
                     f"{sum(_ok(r, patched) for r in built)}/{len(built)}; patched verifies where vanilla does not: "
                     f"{', '.join(better) or 'none'}; vanilla verifies where patched does not: "
                     f"{', '.join(worse) or 'none'}")
    return "\n".join(lines)


def comparison(before: List[dict], after: List[dict]) -> str:
    """First contact beside after: one cell per step, ``first → after`` where they differ."""
    first = {r["model"]: r for r in before}
    lines = ["| model | library | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 2)]
    for r in after:
        b = first.get(r["model"], {})
        cells = []
        for step, _ in COLUMNS:
            old = "does not build" if "build" in b else cell(b.get("steps", {}).get(step))
            new = "does not build" if "build" in r else cell(r.get("steps", {}).get(step))
            cells.append(new if old == new else f"{old} → {new}")
        lines.append("| " + " | ".join(_md(c) for c in [r["model"], r["library"], *cells]) + " |")
    return "\n".join(lines)


def machine() -> str:
    import onnx
    import onnxruntime
    import torch
    return (f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, "
            f"Python {platform.python_version()}, one core per model (OMP_NUM_THREADS=1)")


def markers(round_: int):
    """Each round's tables sit between their own markers, so re-running one round leaves the other's."""
    tag = "sweep" if round_ == 1 else f"sweep{round_}"
    return f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"


def render(rows: List[dict], seconds: float, round_: int = 1, before: Optional[List[dict]] = None) -> str:
    begin, end = markers(round_)
    compared = [] if before is None else [
        "### First contact → after", "First contact:\n\n" + summary(before) + "\n" + exporter_figures(before),
        "After:\n\n" + summary(rows) + "\n" + property_line(rows) + "\n" + exporter_figures(rows),
        comparison(before, rows)]
    figures = [summary(rows) + "\n" + property_line(rows), exporter_figures(rows)] if before is None else []
    return "\n\n".join([
        begin, *compared, *figures, "### Outcomes", table(rows),
        "Cells: `ok`: exported, and ONNX Runtime matched the unpatched eager model at three shapes the export never "
        "saw (B=1 first, other lengths); `export ✗`: the exporter raised; `dim baked`: a dim declared dynamic is a "
        "number in the graph; `ORT ✗ new shape`: ONNX Runtime fails at a new shape; `wrong numbers`: it runs, with "
        "other numbers than eager; `eager ✗`: the model itself fails at a verification shape. "
        "`export(auto)`: `ok (exporter)` when `onnx_compat.export` verified a model.",
        "### Patterns by models stopped", ranking(rows),
        "### Every error", errors_table(rows),
        f"Made by `benchmarks/sweep/sweep.py` (`--write`, `--json`; parallel workers joined with `--merge`) on "
        f"{machine()}; the steps took {seconds / 60:.0f} min in all.",
        end])


def write_block(path: str, text: str, round_: int = 1) -> None:
    """Replace the block between the round's markers (the prose around it is written by hand)."""
    begin, end = markers(round_)
    old = open(path).read() if os.path.exists(path) else ""
    if begin in old and end in old:
        text = old[:old.index(begin)] + text + old[old.index(end) + len(end):]
    elif old:
        text = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def _round_robin(names: List[str]) -> List[str]:
    by_library: Dict[str, List[str]] = {}
    for n in names:
        by_library.setdefault(ENTRIES[n].library, []).append(n)
    queues = list(by_library.values())
    out: List[str] = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def main(argv=None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="models whose name contains this (repeatable)")
    parser.add_argument("--round", type=int, default=1,
                        help="the sweep round whose models run and whose block --write replaces (1: sweep_models.py, "
                             "2: sweep_models2.py, 3: sweep_models3.py and sweep_models3b.py, 4: sweep_models4.py, 5: sweep_models5.py)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per step")
    parser.add_argument("--json", help="write the rows here (and resume from it with --resume)")
    parser.add_argument("--resume", action="store_true", help="keep rows already in --json")
    parser.add_argument("--write", help="write the tables into this markdown file")
    parser.add_argument("--interleave", action="store_true",
                        help="one model per library in turn (a run cut short still covers every library)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="combine the rows of these runs (a later file's step replaces an earlier one's) into "
                             "--json and --write; no exports")
    parser.add_argument("--rescore", action="store_true", help="re-classify the rows of --json, no exports")
    parser.add_argument("--as-recorded", action="store_true",
                        help="with --merge: keep each row's recorded patterns (no re-classification), e.g. to add a "
                             "column computed from the recorded steps without changing anything else")
    parser.add_argument("--before", metavar="JSON",
                        help="the first-contact rows of the same models: --write shows them beside these")
    args = parser.parse_args(argv)
    steps = tuple(s for s in args.steps.split(",") if s)
    unknown = set(steps) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {STEPS}")
    if args.merge:
        rows = merged(args.merge, reclassify=not args.as_recorded)
        _write(args, rows)
        return rows
    names = [n for n in ENTRIES if ENTRIES[n].round == args.round
             and (not args.only or any(o in n for o in args.only))]
    if args.interleave:
        names = _round_robin(names)
    done = {r["model"]: r for r in (_load(args.json) or [])} if args.json and (args.resume or args.rescore) else {}
    rows = []
    for name in names:
        if name in done:
            rows.append(classify(done[name]) if args.rescore else done[name])
            continue
        if args.rescore:
            continue
        rows.append(run_model(name, steps, args.timeout))
        print(f"{name}: " + ", ".join(f"{s}={cell(o)}" for s, o in rows[-1]["steps"].items())
              + (f" BUILD: {rows[-1]['build']['error']}" if "build" in rows[-1] else ""), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows + [r for n, r in done.items() if n not in names], f, indent=1)
    _write(args, rows)
    return rows


def _write(args, rows: List[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    before = [classify(r) for r in _load(args.before)] if getattr(args, "before", None) else None
    text = render(rows, sum(o.get("seconds", 0) for r in rows for o in r.get("steps", {}).values()), args.round,
                  before)
    if args.write:
        write_block(args.write, text, args.round)
    else:
        print(text)


def merged(paths: List[str], reclassify: bool = True) -> List[dict]:
    """Rows of several runs (parallel workers, a re-run of some steps) in the list's order, re-classified unless
    ``reclassify`` is False (each row keeps the patterns it was recorded with)."""
    rows: Dict[str, dict] = {}
    for path in paths:
        loaded = _load(path) or []
        for r in [loaded] if isinstance(loaded, dict) else loaded:  # a list of rows, or one model's file
            row = rows.setdefault(r["model"], {k: v for k, v in r.items() if k not in ("steps", "running")}
                                  | {"steps": {}})
            if "build" in r:
                row["build"] = r["build"]
            elif r.get("steps"):  # a later run that built it replaces an earlier one that did not
                row.pop("build", None)
            row["steps"].update(r.get("steps", {}))
    return [classify(rows[n]) if reclassify else rows[n] for n in ENTRIES if n in rows]


if __name__ == "__main__":
    main()
