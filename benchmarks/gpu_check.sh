#!/usr/bin/env bash
# Every GPU measurement in one call, for the rare session that is lent a GPU (one H100 or H200,
# no network, no vLLM, no llama.cpp; about 4 minutes of the card's time after start-up):
#   1. benchmarks/gpu_reducer.py: the Triton reducer's rows/s and share of the card's memory
#      bandwidth (128,256-token vocabulary), its share of a Llama-3-8B-shaped forward, and the
#      hidden-state replay plus reduction as a fraction of that forward (target < 5 %);
#   2. benchmarks/transformers_overhead.py: that 8B shape (random bf16 weights made on the device)
#      through the transformers engine: base as raw rows, container and hidden states, then
#      compare against the bare forward + log_softmax (target <= 1.3x), compare from the
#      hidden-state file, and the base-row feed alone (does the device wait for the host?);
#   3. llama.cpp on the GPU, where .gpu/llama.cpp.tar.xz is carried (scripts/build_cuda_llamacpp.sh
#      --pack makes it): the CUDA build for this GPU (about 5 minutes on 16 cores), a random-weight
#      SmolLM2-1.7B-shaped model with SmolLM2's tokenizer (.gpu/vocab.gguf, benchmarks/gpu_model.py)
#      and its Q8_0 and Q4_K_M, then benchmarks/llamacpp_gpu.py: kldtool's base and compare with
#      -ngl 99 against llama-perplexity's with the same build (identical file and lines; time ratio).
#      It runs first: KLDTOOL_GPU_SECTIONS (default "llamacpp reducer transformers") picks and orders.
# Each prints its RESULTS.md rows (appended to $RESULTS, default benchmarks/RESULTS.md).
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine (docs/benchmarks.md: what to carry)
#   bash benchmarks/gpu_check.sh --dry-run  # the same scripts on the CPU at toy sizes (CI: they never rot)
#
# Inputs, both small enough to travel with the checkout: a tokenizer directory whose ids fit the
# 8B vocabulary ($KLDTOOL_GPU_TOKENIZER, default .gpu/tokenizer, else the built-in SmolLM2's) and
# a text ($KLDTOOL_GPU_TEXT, default .gpu/wiki.test.txt, else ../shared's WikiText-2). Wheels in
# .whl/ (zstandard, platformdirs, diskcache: the GPU image lacks them) are installed to /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import zstandard, platformdirs, diskcache" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
TOK=${KLDTOOL_GPU_TOKENIZER:-.gpu/tokenizer}
[ -d "$TOK" ] || TOK=$("$PY" -c "from kldtool.engines.defaults import default_transformers_model as d; print(d())")
TEXT=${KLDTOOL_GPU_TEXT:-.gpu/wiki.test.txt}
[ -f "$TEXT" ] || TEXT=../shared/data/wikitext-2/wiki.test.txt
export PYTHONUNBUFFERED=1
SECTIONS=${KLDTOOL_GPU_SECTIONS:-llamacpp reducer transformers}

llamacpp_section() {
  if [ "$DRY" = 1 ]; then
    "$PY" benchmarks/llamacpp_gpu.py --dry-run --results "$RESULTS"
    return
  fi
  local src=${KLDTOOL_GPU_LLAMACPP:-.gpu/llama.cpp.tar.xz} built=/tmp/llamacpp-cuda models=/tmp/gpu-models
  if [ ! -f "$src" ] || [ ! -f .gpu/vocab.gguf ]; then
    echo "gpu_check: no $src or .gpu/vocab.gguf: the llama.cpp section is skipped (docs/benchmarks.md)"
    return
  fi
  bash scripts/build_cuda_llamacpp.sh --src "$src" --out "$built"
  # shellcheck disable=SC1091
  source "$built"/env.sh
  mkdir -p "$models"
  "$PY" benchmarks/gpu_model.py make .gpu/vocab.gguf "$models/f16.gguf" --shape "${KLDTOOL_GPU_SHAPE:-1.7b}"
  local quants=()
  for t in Q8_0 Q4_K_M; do
    "$built/bin/llama-quantize" "$models/f16.gguf" "$models/$t.gguf" "$t" "$(nproc)" >/dev/null 2>&1
    quants+=(--quant "$models/$t.gguf")
  done
  KLDTOOL_GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" \
    "$PY" benchmarks/llamacpp_gpu.py --peer "$built/bin/llama-perplexity" --base-model "$models/f16.gguf" \
    "${quants[@]}" --text "$TEXT" --chunks "${KLDTOOL_GPU_CHUNKS:-60}" --rounds 2 --results "$RESULTS"
}

reducer_section() {
  if [ "$DRY" = 1 ]; then
    "$PY" benchmarks/gpu_reducer.py --tiny --results "$RESULTS"
  else
    "$PY" benchmarks/gpu_reducer.py --sweep --results "$RESULTS"
  fi
}

transformers_section() {
  if [ "$DRY" = 1 ]; then
    "$PY" benchmarks/transformers_overhead.py --tiny --ctx 256 --chunks 2 --rounds 1 --hidden --profile \
        --tokenizer "$TOK" --text "$TEXT" --results "$RESULTS"
  else
    "$PY" benchmarks/transformers_overhead.py --device cuda --dtype bfloat16 --ctx 2048 --chunks 8 --batch 8192 \
        --rounds 2 --random-llama-8b --hidden --profile --tokenizer "$TOK" --text "$TEXT" --results "$RESULTS"
  fi
}

if [ "$DRY" = 1 ]; then
  RESULTS=${RESULTS:-$(mktemp -t gpu-check-XXXXXX.md)}
  # Triton has no CPU backend: its interpreter runs the same kernel (it must be set before import).
  export TRITON_INTERPRET=1
else
  RESULTS=${RESULTS:-benchmarks/RESULTS.md}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
fi
for section in $SECTIONS; do
  case "$section" in
    llamacpp | reducer | transformers) "${section}_section" ;;
    *) echo "gpu_check: KLDTOOL_GPU_SECTIONS: no section $section (llamacpp, reducer, transformers)" >&2; exit 2 ;;
  esac
done
echo "gpu_check: rows appended to $RESULTS"
