"""What the op-tail patches cost in the graph: nodes of the vanilla and the patched export, and after cleanup.

    .venv/bin/python benchmarks/op_tail.py [--only NAME ...] [--write docs/benchmarks.md]

The cases are the op-tail table of ``onnx_compat/models/op_tail_cases.py`` (and LSTMP from
``recurrent_cases.py``), which ``tests/test_ops.py`` asserts, exported at the same example sizes, vanilla and
under ``patched()``, with both exporters, in one run. Eager code never sees the
patches (``tests/test_ops.py`` checks it bit for bit), so the graph is the cost.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_block import add_write_option, write_marked  # noqa: E402

import onnx_compat  # noqa: E402
from onnx_compat.pipeline.cleanup import cleanup  # noqa: E402
from onnx_compat.models import op_tail_cases, recurrent_cases  # noqa: E402
from onnx_compat.pipeline.capture import error_line  # noqa: E402
from onnx_compat.testing import EXPORTERS  # noqa: E402


# the benchmark index's header (benchmarks/index.py): cost class, the page whose table it writes
BENCHMARK = {"cost": "fast", "writes": "docs/benchmarks.md"}


def _build_export_check(case):
    return case.model, case.export, case.assert_matches


def cases():
    out = {case.name: _build_export_check(case) for case in op_tail_cases.CASES}
    out["lstm_proj_size"] = _build_export_check(recurrent_cases.LSTMP)
    return out


def _gist(line: str) -> str:
    """The words of an error that say what failed, without class names and ORT's prefixes."""
    line = re.sub(r"^\w+: ", "", line)
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "ONNX Runtime: ", line)
    line = line.replace("Exporting the operator ", "").replace("Unsupported: ONNX export of operator ", "")
    return line[:70].replace("|", "/")


def _vanilla(build, export, check, exporter) -> str:
    model = build()
    try:
        proto = export(model, exporter)
        check(proto, model)
    except AssertionError:
        return "wrong numbers"
    except Exception as exc:  # noqa: BLE001 - the outcome is the row
        return "fails: " + _gist(error_line(exc))
    return f"ok ({len(proto.graph.node)})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="case names")
    add_write_option(parser, "op-tail", "docs/benchmarks.md")
    args = parser.parse_args(argv)
    rows = []
    for name, (build, export, check) in cases().items():
        if args.only and name not in args.only:
            continue
        for exporter in EXPORTERS:
            vanilla = _vanilla(build, export, check, exporter)
            model = build()
            with onnx_compat.patched():
                proto = export(model, exporter)
            check(proto, model)
            cleaned = cleanup(proto)
            check(cleaned, model)
            rows.append((name, exporter, vanilla, len(proto.graph.node), len(cleaned.graph.node)))
    lines = ["| case | exporter | vanilla (nodes) | patched nodes | after cleanup |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    lines += ["", f"torch {torch.__version__}; every patched graph verified against eager at new sizes, "
                  "before and after cleanup"]
    print("\n".join(lines))
    if args.write:
        write_marked(args.write, "\n".join(lines), "op-tail")
    return rows


if __name__ == "__main__":
    main()
