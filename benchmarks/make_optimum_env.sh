#!/usr/bin/env bash
# The peer's environment for benchmarks/hf_vs_optimum.py: optimum-onnx with the transformers 4 it accepts (it does
# not run with transformers 5), torch and ONNX pinned as in constraints.txt, and our own dependencies beside them so
# `--same-env` can run this checkout there too. A scratch venv, never the project's .venv; the constraints file keeps
# optimum's requirements from replacing the pinned torch (and from pulling torchvision/torchaudio).
#
#   benchmarks/make_optimum_env.sh [VENV]        # default /work/scratch/hf/venv
#   .venv/bin/python benchmarks/hf_vs_optimum.py --optimum-python VENV/bin/python --same-env
set -euo pipefail
VENV=${1:-/work/scratch/hf/venv}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
V="$VENV/bin"
PINS=$(mktemp)
trap 'rm -f "$PINS"' EXIT
# torch and ONNX exactly as the project's constraints.txt; transformers the last 4.x optimum 2.1 accepts
grep -E '^(torch|onnx|onnxruntime|onnxscript|onnx-ir|numpy|ml-dtypes|protobuf|wrapt)==' "$ROOT/constraints.txt" > "$PINS"
"$V/pip" install -q torch==2.13.0
"$V/pip" install -q -c "$PINS" optimum-onnx==0.1.0 optimum==2.1.0 transformers==4.57.6 \
    onnx onnxruntime onnxscript onnx-ir numpy ml-dtypes protobuf wrapt
"$V/python" -c "import torch, transformers, optimum.exporters.onnx, onnxscript, wrapt; \
print('optimum environment ready:', '$VENV', 'torch', torch.__version__, 'transformers', transformers.__version__)"
