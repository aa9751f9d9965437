"""``make demo``: the bundled conv stack through both exporters, then the pipeline.

Part 1 shows what the conv patch changes: the same model exported by vanilla
``torch.onnx.export`` (TorchScript) and through ``onnx_compat.export`` with each
exporter, checked in ONNX Runtime at shapes the export never saw. Part 2 runs
the whole pipeline (auto exporter, lengths, RASR check) and prints its report.
"""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import onnx
import torch

from . import exporters, graph
from .export import export
from .models import conv_demo
from .spec import dim_sizes, make_inputs
from .verify import session


def _vanilla_torchscript(job, path):
    """Plain torch.onnx.export, no patches: what a user gets today."""
    inputs = job["inputs"]
    feeds = make_inputs(inputs, dim_sizes(inputs))
    extra = {"dynamo": False} if "dynamo" in exporters._EXPORT_PARAMS else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(job["model"], tuple(feeds.values()), path, input_names=list(feeds),
                              output_names=["output", "output:size1"],
                              dynamic_axes={"data": {0: "batch", 1: "time"}, "data:size1": {0: "batch"}}, **extra)
        except Exception as exc:
            return f"export fails: {str(exc).splitlines()[0][:90]}"
    proto = onnx.load(path)
    try:
        sess = session(path)
        other = make_inputs(inputs, {"batch": 1, "time": 23}, seed=5)
        sess.run(None, {k: v.numpy() for k, v in other.items()})
    except Exception as exc:
        return f"{len(proto.graph.node)} nodes, auto_pad {len(graph.auto_pad_nodes(proto))}, " \
               f"ONNX Runtime fails: {str(exc).splitlines()[0][-80:]}"
    return f"{len(proto.graph.node)} nodes, auto_pad {len(graph.auto_pad_nodes(proto))}, runs"


def main() -> None:
    print(f"onnx_compat demo: torch {torch.__version__}, onnx {onnx.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        job = conv_demo.build_hard()
        print("\n1. conv stack: Conv1d(k=4, same), Conv1d(k=3, same, dilation=2), Conv1d(k=4, same, dilation=3)")
        print(f"   {'vanilla torchscript':22s} {_vanilla_torchscript(job, os.path.join(tmp, 'vanilla.onnx'))}")
        for name in ("torchscript", "dynamo") if exporters.HAS_DYNAMO else ("torchscript",):
            report = export(job["model"], os.path.join(tmp, f"{name}.onnx"), job["inputs"], job["outputs"],
                            exporter=name)
            shapes = ", ".join(f"B={c['sizes']['batch']}/T={c['sizes']['time']}" for c in report.verification)
            before = f" ({report.nodes_before_cleanup} before cleanup)" if report.nodes_before_cleanup else ""
            print(f"   {'onnx_compat ' + name:22s} {report.nodes} nodes{before}, auto_pad {len(report.auto_pad)}, "
                  f"verified at {shapes}, max abs err {report.max_abs_err:.2e}")

        print("\n2. the pipeline: classic demo (3x Conv1d k=5 same, lengths in and out), exporter=auto, RASR check")
        job = conv_demo.build()
        path = os.path.join(tmp, "demo.onnx")
        report = export(job["model"], path, job["inputs"], job["outputs"], exporter="auto", rasr=True)
        print("   " + report.summary().replace("\n", "\n   "))
        assert np.isfinite(report.max_abs_err)


if __name__ == "__main__":
    main()
