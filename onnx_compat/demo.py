"""``make demo``: the bundled models through vanilla export and through the pipeline.

Part 1 shows what the conv patch changes: a conv stack exported by vanilla
``torch.onnx.export`` and through ``onnx_compat.export`` with each exporter,
checked in ONNX Runtime at shapes the export never saw. Part 2 runs the whole
pipeline on the bundled Conformer (auto exporter, lengths in and out,
verification, RASR check with the roles the model fits) and prints its report.
"""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import onnx
import torch

from onnx_compat.pipeline import capture as exporters
from onnx_compat.api import export
from onnx_compat.models import conformer, conv_demo
from onnx_compat.pipeline.vanilla import vanilla_export


def main() -> None:
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
    print(f"onnx_compat demo: torch {torch.__version__}, onnx {onnx.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        job = conv_demo.build_hard()
        print("\n1. conv stack: Conv1d(k=4, same), Conv1d(k=3, same, dilation=2), Conv1d(k=4, same, dilation=3)")
        vanilla = vanilla_export(job["model"], job["inputs"], job["outputs"], "torchscript")
        print(f"   {'vanilla torchscript':22s} {vanilla}")
        for name in ("torchscript", "dynamo") if exporters.HAS_DYNAMO else ("torchscript",):
            report = export(job["model"], os.path.join(tmp, f"{name}.onnx"), job["inputs"], job["outputs"],
                            exporter=name)
            shapes = ", ".join(f"B={c['sizes']['batch']}/T={c['sizes']['time']}" for c in report.verification)
            before = f" ({report.nodes_before_cleanup} before cleanup)" if report.nodes_before_cleanup else ""
            print(f"   {'onnx_compat ' + name:22s} {report.nodes} nodes{before}, auto_pad {len(report.auto_pad)}, "
                  f"verified at {shapes}, max abs err {report.max_abs_err:.2e}")

        print("\n2. the pipeline: bundled Conformer (4x subsampling, rel-pos attention, conv module), "
              "exporter=auto, RASR check")
        job = conformer.tiny()
        if exporters.HAS_DYNAMO:
            print(f"   {'vanilla dynamo':22s} {vanilla_export(job['model'], job['inputs'], job['outputs'], 'dynamo')}")
        path = os.path.join(tmp, "conformer.onnx")
        report = export(job["model"], path, job["inputs"], job["outputs"], exporter="auto", rasr=True)
        print("   " + report.summary().replace("\n", "\n   "))
        roles = report.rasr["roles"]
        print(f"   RASR roles: {', '.join(roles)}; feature-scorer needs T' = T, "
              f"{'which holds' if 'feature-scorer' in roles else 'but this model subsamples time 4x'}")
        assert np.isfinite(report.max_abs_err) and roles


if __name__ == "__main__":
    main()
