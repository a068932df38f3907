#!/usr/bin/env bash
# The main job on the built-in defaults, from nothing: set up .venv, write a base file with the
# fp32 SmolLM2-135M (transformers) over Python's built-in pydoc text, then compare the Q4_1
# GGUF (llama.cpp) against it. CHUNKS (default 40) bounds the run; CHUNKS=all uses every chunk.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT:-quickstart-out}
mkdir -p "$OUT"
CHUNKS=${CHUNKS:-40}
chunk_args=()
[ "$CHUNKS" = all ] || chunk_args=(--chunks "$CHUNKS")
.venv/bin/kldtool base --engine transformers "${chunk_args[@]}" --kl-divergence-base "$OUT/base-smollm2-f32.kldt"
.venv/bin/kldtool compare --kl-divergence-base "$OUT/base-smollm2-f32.kldt" --engine llamacpp \
  --json "$OUT/compare-smollm2-q4_1.json"
echo "results: $OUT/compare-smollm2-q4_1.json" >&2
