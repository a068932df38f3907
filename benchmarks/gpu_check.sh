#!/usr/bin/env bash
# Every GPU measurement in one call, for the rare session that is lent a GPU (one H100 or H200,
# no network, no vLLM, no llama.cpp; about 4 minutes of the card's time after start-up):
#   1. benchmarks/gpu_reducer.py: the Triton reducer's rows/s and share of the card's memory
#      bandwidth (128,256-token vocabulary), its share of a Llama-3-8B-shaped forward, and the
#      hidden-state replay plus reduction as a fraction of that forward (target < 5 %);
#   2. benchmarks/transformers_overhead.py: that 8B shape (random bf16 weights made on the device)
#      through the transformers engine: base as raw rows, container and hidden states, then
#      compare against the bare forward + log_softmax (target <= 1.3x), compare from the
#      hidden-state file, and the base-row feed alone (does the device wait for the host?).
# Each prints its RESULTS.md rows (appended to $RESULTS, default benchmarks/RESULTS.md).
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine (docs/benchmarks.md: what to carry)
#   bash benchmarks/gpu_check.sh --dry-run  # the same scripts on the CPU at toy sizes (CI: they never rot)
#
# Inputs, both small enough to travel with the checkout: a tokenizer directory whose ids fit the
# 8B vocabulary ($KLDTOOL_GPU_TOKENIZER, default .gpu/tokenizer, else the built-in SmolLM2's) and
# a text ($KLDTOOL_GPU_TEXT, default .gpu/wiki.test.txt, else ../shared's WikiText-2). Wheels in
# .whl/ (zstandard, platformdirs: the GPU image lacks them) are installed to /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import zstandard, platformdirs" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
TOK=${KLDTOOL_GPU_TOKENIZER:-.gpu/tokenizer}
[ -d "$TOK" ] || TOK=$("$PY" -c "from kldtool.engines.defaults import default_transformers_model as d; print(d())")
TEXT=${KLDTOOL_GPU_TEXT:-.gpu/wiki.test.txt}
[ -f "$TEXT" ] || TEXT=../shared/data/wikitext-2/wiki.test.txt
export PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
  RESULTS=${RESULTS:-$(mktemp -t gpu-check-XXXXXX.md)}
  # Triton has no CPU backend: its interpreter runs the same kernel (it must be set before import).
  export TRITON_INTERPRET=1
  "$PY" benchmarks/gpu_reducer.py --tiny --results "$RESULTS"
  "$PY" benchmarks/transformers_overhead.py --tiny --ctx 256 --chunks 2 --rounds 1 --hidden --profile \
      --tokenizer "$TOK" --text "$TEXT" --results "$RESULTS"
else
  RESULTS=${RESULTS:-benchmarks/RESULTS.md}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
  "$PY" benchmarks/gpu_reducer.py --sweep --results "$RESULTS"
  "$PY" benchmarks/transformers_overhead.py --device cuda --dtype bfloat16 --ctx 2048 --chunks 8 --batch 8192 \
      --rounds 2 --random-llama-8b --hidden --profile --tokenizer "$TOK" --text "$TEXT" --results "$RESULTS"
fi
echo "gpu_check: rows appended to $RESULTS"
