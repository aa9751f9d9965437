"""The support matrix: the whole test suite, and the bundled Conformer and BLSTM through
``export(exporter="auto")``, in one venv per torch version (``make test-matrix``).

    .venv/bin/python benchmarks/support_matrix.py [--write docs/compatibility.md] [--json OUT]
                                                  [--from-json IN ...] VENV ...

Each venv runs ``pytest -n 2 tests`` on its own; skips are grouped by reason.
The table goes to stdout (and between the ``<!-- test-matrix -->`` markers of
``docs/compatibility.md`` with ``--write``); the per-version skip reasons follow it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402
import xml.etree.ElementTree as ET

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/compatibility.md",
             "needs": "`make test-matrix` (one venv per torch release)"}

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUNDLED = ["onnx_compat Conformer (tiny)", "onnx_compat BLSTM"]


def _check() -> dict:
    """In the venv under test: versions, exporters, patches, and the bundled models through auto."""
    import importlib.metadata as md

    import onnx_compat
    from onnx_compat.pipeline.capture import HAS_DYNAMO
    from onnx_compat.models.zoo import ZOO

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None
    out = {"versions": {p: version(p) for p in ("torch", "onnx", "onnxruntime", "onnxscript", "numpy")},
           "exporters": ["dynamo", "torchscript"] if HAS_DYNAMO else ["torchscript"],
           "available": sorted(onnx_compat.available_patches()),
           "unavailable": onnx_compat.unavailable_patches(), "bundled": {}}
    for name in BUNDLED:
        job = ZOO[name]()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                report = onnx_compat.export(job["model"], os.path.join(tmp, "m.onnx"), job["inputs"], job["outputs"],
                                            exporter="auto")
                out["bundled"][name] = {"exporter": report.exporter, "why": report.why,
                                        "max_abs_err": report.max_abs_err, "shapes": len(report.verification)}
            except Exception as exc:  # noqa: BLE001 - recorded in the table
                out["bundled"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return out


def _pytest(python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        t0 = time.perf_counter()
        run = subprocess.run([python, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                              "-m", "not fuzz", "tests"], cwd=ROOT, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
        if not os.path.exists(xml):
            return {"error": (run.stdout + run.stderr).strip().splitlines()[-1:], "seconds": seconds}
        counts, skips, failures = collections.Counter(), collections.Counter(), []
        for case in ET.parse(xml).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            skipped = case.find("skipped")
            failed = case.find("failure") if case.find("failure") is not None else case.find("error")
            if failed is not None:
                counts["failed"] += 1
                failures.append(f"{name}: {(failed.get('message') or '').splitlines()[0][:200]}")
            elif skipped is not None:
                counts["skipped"] += 1
                reason = re.sub(r"^Skipped: ", "", skipped.get("message") or "")
                skips[reason[:160]] += 1
            else:
                counts["passed"] += 1
    return {"counts": dict(counts), "skips": dict(skips), "failures": failures, "seconds": seconds,
            "exit": run.returncode}


def run_venv(venv: str) -> dict:
    python = os.path.join(venv, "bin", "python")
    check = subprocess.run([python, os.path.abspath(__file__), "--check"], cwd=ROOT, capture_output=True, text=True,
                           check=False)
    row = {"venv": venv}
    if check.returncode != 0:
        row["check_error"] = (check.stderr.strip().splitlines() or ["?"])[-1]
    else:
        row.update(json.loads(check.stdout.strip().splitlines()[-1]))
    row["tests"] = _pytest(python)
    return row


def _bundled(entry: dict) -> str:
    if "error" in entry:
        return f"fails: {entry['error'][:80]}"
    return f"{entry['exporter']}, {entry['shapes']} shapes, err {entry['max_abs_err']:.1e}"


def table(rows) -> str:
    lines = ["| torch | onnx / onnxruntime / onnxscript / numpy | exporters | patches (unavailable) | "
             "tests passed / skipped / failed | Conformer (tiny), auto | BLSTM, auto |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        v = row.get("versions", {})
        tests = row["tests"].get("counts", {})
        unavailable = row.get("unavailable", {})
        lines.append(
            f"| {v.get('torch', row['venv'])} | {v.get('onnx')} / {v.get('onnxruntime')} / {v.get('onnxscript') or '-'}"
            f" / {v.get('numpy')} | {', '.join(row.get('exporters', []))} | {len(row.get('available', []))}"
            f" ({len(unavailable)}) | {tests.get('passed', 0)} / {tests.get('skipped', 0)} / {tests.get('failed', 0)}"
            f" | {_bundled(row.get('bundled', {}).get(BUNDLED[0], {'error': row.get('check_error', '?')}))}"
            f" | {_bundled(row.get('bundled', {}).get(BUNDLED[1], {'error': row.get('check_error', '?')}))} |")
    return "\n".join(lines)


def details(rows) -> str:
    out = []
    for row in rows:
        v = row.get("versions", {}).get("torch", row["venv"])
        out.append(f"\ntorch {v} ({row['tests'].get('seconds', 0):.0f} s):")
        for name, reason in sorted(row.get("unavailable", {}).items()):
            out.append(f"  patch {name} unavailable: {reason}")
        for reason, n in sorted(row["tests"].get("skips", {}).items(), key=lambda kv: -kv[1]):
            out.append(f"  skipped {n:3d}: {reason}")
        for failure in row["tests"].get("failures", []):
            out.append(f"  FAILED {failure}")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        print(json.dumps(_check()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venvs", nargs="*")
    ap.add_argument("--from-json", nargs="+", default=[],
                    help="rows saved by earlier runs (--json), merged with this run's; the latest per torch wins")
    add_write_option(ap, "test-matrix", "docs/compatibility.md")
    ap.add_argument("--json", help="also save the raw rows here")
    args = ap.parse_args()
    rows = []
    for saved in args.from_json:
        with open(saved) as f:
            rows += json.load(f)
    for venv in args.venvs:
        rows.append(run_venv(venv))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        print(details(rows[-1:]), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    latest = {r.get("versions", {}).get("torch") or r["venv"]: r for r in rows}
    rows = list(latest.values())
    rows.sort(key=lambda r: [int(x) for x in re.findall(r"\d+", r.get("versions", {}).get("torch") or "0")[:3]])
    text = table(rows)
    print(text)
    print(details(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.write:
        why = details(rows).strip("\n")
        write_marked(args.write, f"{text}\n\n<details><summary>Each release's unavailable patches and skips, with "
                                 f"their reasons</summary>\n\n```\n{why}\n```\n</details>", "test-matrix")
    failed = sum(r["tests"].get("counts", {}).get("failed", 0) + ("error" in r["tests"]) for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
