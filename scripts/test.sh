#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# llm-compressor, in its own environment, builds the quantized checkpoints the vLLM tests load.
bash scripts/quant/setup.sh
exec .venv/bin/python -m pytest "$@"
