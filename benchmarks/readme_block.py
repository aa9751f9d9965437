"""Replace a measured table in the README between its two marker lines (``--write README.md``)."""
from __future__ import annotations


def write_block(readme: str, text: str, begin: str, end: str) -> None:
    """``text`` between the lines ``begin`` and ``end`` of ``readme``; a README without them is an error."""
    with open(readme, encoding="utf-8") as f:
        content = f.read()
    if begin not in content or end not in content:
        raise SystemExit(f"{readme} has no {begin} ... {end} block to replace")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + text + "\n" + end + tail)


def write_marked(readme: str, text: str, name: str) -> None:
    """The block between ``<!-- name -->`` and ``<!-- /name -->``."""
    write_block(readme, text, f"<!-- {name} -->", f"<!-- /{name} -->")
