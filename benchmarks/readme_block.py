"""Replace a generated table in a Markdown page between its two marker lines (``--write docs/PAGE.md``).

Each table lives in the page about its topic (the benchmarks in ``docs/benchmarks.md``, the zoo in
``docs/models.md``, the support matrix in ``docs/compatibility.md``, the runtimes in ``docs/deploying.md``),
so the script that measures it rewrites it where readers find it. A page without the markers is an error
that names the page holding them, so ``--write README.md`` from an old habit says where to look.
"""
from __future__ import annotations

import argparse
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_block(page: str, text: str, begin: str, end: str) -> None:
    """``text`` between the lines ``begin`` and ``end`` of ``page``; a page without them is an error."""
    with open(page, encoding="utf-8") as f:
        content = f.read()
    if begin not in content or end not in content:
        raise SystemExit(f"{page} has no {begin} ... {end} block to replace{_found_in(begin, end)}")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(page, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + text + "\n" + end + tail)


def write_marked(page: str, text: str, name: str) -> None:
    """The block between ``<!-- name -->`` and ``<!-- /name -->``."""
    write_block(page, text, f"<!-- {name} -->", f"<!-- /{name} -->")


def add_write_option(parser: argparse.ArgumentParser, table: str, page: str) -> None:
    """``--write PAGE``, its help naming the page of this checkout that holds ``table``."""
    parser.add_argument("--write", metavar="PAGE", help=f"replace the {table} table in PAGE (it is in {page})")


def _found_in(begin: str, end: str) -> str:
    """Which pages of this checkout hold the markers, for the error message."""
    pages = sorted(glob.glob(os.path.join(ROOT, "*.md"))) + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    found = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            content = f.read()
        if begin in content and end in content:
            found.append(os.path.relpath(page, ROOT))
    return f" (it is in {', '.join(found)})" if found else ""
