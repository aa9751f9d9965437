"""What torch.export's options for data-dependent values add to ``auto``, on the sweep's models it cannot export.

    VENV/bin/python benchmarks/capture_options.py [--only MODEL ...] [--write docs/pipeline.md]

``auto`` tries TorchScript and dynamo under the patches, then each without them
(``capture.AUTO``). A further capture strategy only runs when all of those
failed, so it costs nothing where they succeed, and it pays only where it turns
such a failure into a graph that verifies. For each sweep model (``VENV`` is
the sweep's environment, ``benchmarks/sweep/make_env.sh``; default: every
model of ``sweep_models.py`` and, where present, ``sweep_models2.py``), this
runs ``onnx_compat.export(exporter="auto")`` with ``auto``'s strategies; where
that fails, it exports once with each option of ``capture_options.CAPTURE_OPTIONS``
alone (under the patches, through the same verification) and counts the models
each one verifies and its time. The table goes between
``<!-- capture-options -->`` and ``<!-- /capture-options -->``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "sweep"))
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
import torch  # noqa: E402
from onnx_compat.pipeline import capture, capture_options  # noqa: E402

# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "slow", "writes": "docs/pipeline.md",
             "needs": "the sweep's environment (benchmarks/sweep/make_env.sh VENV); run with VENV/bin/python"}


@contextlib.contextmanager
def strategies(chosen):
    """``auto`` tries exactly ``chosen`` while it is open."""
    kept = capture.AUTO
    capture.AUTO = tuple(chosen)
    try:
        yield
    finally:
        capture.AUTO = kept


def attempt(job: dict, chosen) -> dict:
    """One ``export(auto)`` with ``chosen`` as its strategies: verified or not, by which, in what time."""
    t0 = time.perf_counter()
    with strategies(chosen), tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        try:
            report = onnx_compat.export(job["model"], os.path.join(tmp, "m.onnx"), job["inputs"], job["outputs"],
                                        exporter="auto")
        except Exception as exc:  # a failure is a row's cell, not the end of the run
            return {"ok": False, "seconds": time.perf_counter() - t0,
                    "error": (str(exc).strip().splitlines() or [type(exc).__name__])[0]}
    return {"ok": True, "seconds": time.perf_counter() - t0, "by": report.strategy,
            "assumed": getattr(report, "assumed", [])}


def entries() -> Dict[str, object]:
    from sweep_models import ENTRIES
    try:
        import sweep_models2  # noqa: F401  (round two registers itself into ENTRIES)
    except ImportError:
        pass
    return ENTRIES


def measure(names: Optional[List[str]] = None) -> List[dict]:
    """Per model: ``auto`` as it is, then (only where it failed) each option alone."""
    rows, found = [], entries()
    base = tuple(s for s in capture.AUTO if s not in capture.FURTHER)
    for name in names or list(found):
        entry = found[name]
        row = {"model": name, "auto": attempt(entry.build(), base)}
        if not row["auto"]["ok"]:
            for option in capture_options.CAPTURE_OPTIONS:
                row[option.label] = attempt(entry.build(), (option,))
        print(name, {k: (v["ok"], round(v["seconds"], 1)) for k, v in row.items() if isinstance(v, dict)},
              flush=True)
        rows.append(row)
    return rows


def table(rows: List[dict]) -> str:
    """One line per option: the models ``auto`` could not export that it verified, of those tried, and its time."""
    tried = [r for r in rows if not r["auto"]["ok"]]
    lines = [f"{len(rows)} sweep models measured; `auto` (without the options) verified {len(rows) - len(tried)}; "
             f"each option was tried alone on the {len(tried)} it did not (torch {torch.__version__}).", "",
             "| option | verified | tried | seconds (sum) | models it verified | kept in auto |",
             "|---|---|---|---|---|---|"]
    for option in capture_options.CAPTURE_OPTIONS:
        cells = [r[option.label] for r in tried]
        saved = [r["model"] for r in tried if r[option.label]["ok"]]
        lines.append(f"| {option.label} | {len(saved)} | {len(cells)} | {sum(c['seconds'] for c in cells):.0f} | "
                     f"{', '.join(saved) or '-'} | {'yes' if option in capture.FURTHER else 'no'} |")
    lines += ["", "| model | " + " | ".join(o.label for o in capture_options.CAPTURE_OPTIONS) + " |",
              "|---|" + "---|" * len(capture_options.CAPTURE_OPTIONS)]
    for r in tried:
        lines.append(f"| {r['model']} | " + " | ".join(
            "ok" if r[o.label]["ok"] else _short(r[o.label]["error"]) for o in capture_options.CAPTURE_OPTIONS) + " |")
    return "\n".join(lines)


def _short(error: str, limit: int = 90) -> str:
    """The attempt's own error, without the "no exporter produced ..." lead and the venv's path."""
    text = error.split(": ", 1)[-1].replace("|", "/")
    text = text.split(": ", 1)[-1] if text.startswith("dynamo (") else text
    text = re.sub(r"\S*site-packages/", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def main(argv=None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="these sweep models only")
    add_write_option(parser, "capture-options", "docs/pipeline.md")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    rows = measure(args.only)
    text = table(rows)
    print(text)
    if args.write:
        write_marked(args.write, text, "capture-options")
    return rows


if __name__ == "__main__":
    main()
