#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The quantized checkpoints the vLLM tests load are built once per machine and cached; their
# llm-compressor environment (scripts/quant/setup.sh) is set up by the tests only when one is missing.
exec .venv/bin/python -m pytest "$@"
