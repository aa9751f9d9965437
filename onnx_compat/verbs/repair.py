"""``onnx-compat repair MODEL.onnx --out FIXED.onnx``: int32 operands of int64 shape arithmetic cast, so it loads."""
from __future__ import annotations

import argparse
import os

from onnx_compat.cli_paths import Files


def add_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser("repair", help="cast int32 operands of int64 shape arithmetic so the model loads")
    r.add_argument("onnx")
    r.add_argument("--out", required=True, help="the repaired .onnx file to write")
    return r


def files(args: argparse.Namespace) -> Files:
    """The model repaired (with its weights file, which it reads) and the repaired model, which is written
    whole (weights inside): it must be another file, so a failed repair never touches the one it read."""
    return Files().read_model(args.onnx, "onnx", "the model repaired").write(args.out, "--out", "the repaired model")


def run(args: argparse.Namespace) -> int:
    from onnx_compat.graph import load
    from onnx_compat.pipeline.files import write_atomically
    from onnx_compat.int_repair import repair_int_types
    from onnx_compat.runtimes.session import open_session
    out = os.path.abspath(args.out)
    fixed, done = repair_int_types(load(args.onnx, load_external_data=True))
    open_session(fixed)  # loads now, or raises with ONNX Runtime's reason
    write_atomically(fixed, out)
    print("\n".join(f"cast     {d}" for d in done) or "nothing to repair")
    return 0
