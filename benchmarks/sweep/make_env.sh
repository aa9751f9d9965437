#!/usr/bin/env bash
# The sweep's environment: torch and ONNX pinned as in constraints.txt, onnx_compat from this checkout, and the
# third-party audio/speech libraries of sweep_models.py beside them. A scratch venv, never the project's .venv
# (the libraries would pull another torch; --no-deps keeps the pinned one).
#
#   benchmarks/sweep/make_env.sh [VENV]        # default /work/scratch/sweep/venv
#   VENV/bin/python benchmarks/sweep/sweep.py --only julius_lowpass --steps vanilla_ts,auto
set -euo pipefail
VENV=${1:-/work/scratch/sweep/venv}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
V="$VENV/bin"
"$V/pip" install -q torch==2.13.0
"$V/pip" install -q onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2 onnx-ir==1.1.0 numpy==2.4.6 \
    ml-dtypes==0.6.0 protobuf==7.36.2 wrapt==2.5.2
"$V/pip" install -q --no-deps -e "$ROOT"
"$V/pip" install -q --no-deps asteroid asteroid-filterbanks julius encodec descript-audio-codec \
    descript-audiotools snac vocos torchcrepe nnaudio torchlibrosa x-transformers local-attention \
    rotary-embedding-torch speechbrain torchaudio demucs openunmix bs-roformer openai-whisper \
    vector-quantize-pytorch bigvgan pytorch-tcn einops einx hyper-connections torch-einops-utils \
    PoPE-pytorch tensorboard randomname argbind docstring-parser importlib-resources
"$V/pip" install -q -c <(echo torch==2.13.0) soundfile flatten-dict pyyaml librosa loguru tqdm beartype \
    frozendict matplotlib hyperpyyaml sentencepiece huggingface_hub scipy joblib resampy ffmpy \
    tiktoken rich absl-py markdown grpcio
# DeepFilterNet3 (#47, 9): its model code and libdf (ERB widths), pinned; loguru is above
"$V/pip" install -q --no-deps deepfilternet==0.5.6 deepfilterlib==0.5.6
# round two (#39, sweep_models2.py): the libraries pinned to the versions measured, --no-deps beside the pinned torch
# (torchcodec only so coqui-tts imports: its audio I/O is never called)
"$V/pip" install -q --no-deps espnet==202511 coqui-tts==0.28.0 coqui-tts-trainer==0.4.0 funasr==1.4.16 \
    panns-inference==0.1.1 silero-vad==6.2.3 resemblyzer==0.1.4 pesto-pitch==2.0.1 torchfcpe==0.0.4 \
    diffsptk==4.0.1 lhotse==1.33.0 speechtokenizer==1.0.1 audioseal==0.2.0 moshi==0.2.13 torchcodec==0.17.0 \
    webrtcvad-wheels==2.0.14.post1 lion-pytorch==0.2.5 accelerate==1.15.0
"$V/pip" install -q -c <(echo torch==2.13.0) typeguard torch-complex kaldiio omegaconf intervaltree cytoolz \
    safetensors audioread click tabulate coqpit-config rapidfuzz six
# round three (#47, sweep_models3.py and sweep_models3b.py) and the probes of rounds four and five (sweep_models4.py, sweep_models5.py): each list pinned,
# --no-deps beside the pinned torch, then the pure-Python modules their model code imports
for half in round3a round3b round4 round5; do
    "$V/pip" install -q --no-deps -r "$ROOT/benchmarks/sweep/$half-libraries.txt"
    "$V/pip" install -q -c <(echo torch==2.13.0) -r "$ROOT/benchmarks/sweep/$half-support.txt"
done
# torchaudio's compiled extensions are built for another torch; its pure-Python models import without them
rm -f "$VENV"/lib/python3.*/site-packages/torchaudio/lib/*.so
echo "sweep environment ready: $VENV"
