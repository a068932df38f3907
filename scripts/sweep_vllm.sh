#!/usr/bin/env bash
# Compare several model directories or hub ids (compressed-tensors, AWQ, GPTQ, FP8 ... anything vLLM loads)
# with the vLLM engine against one base file, then write the report (table + plots).
# Re-running skips every model already done. Each row is named after its directory.
#
#   scripts/sweep_vllm.sh -b BASE.kldt -o OUTDIR [-a] MODEL_DIR_OR_HUB_ID... [-- extra compare flags]
#
# Extra flags go to every `kldtool compare`, e.g. -- --gpu-memory-utilization 0.8 --chunks 100
# -a ranks the models with `kldtool sweep` instead (each stops once its place is settled; the
# extra flags then go to `kldtool sweep`).
set -euo pipefail
. "$(dirname "$0")/lib/sweep.sh"
BASE= OUT= ADAPTIVE=
while getopts "b:o:ah" opt; do
  case $opt in b) BASE=$OPTARG ;; o) OUT=$OPTARG ;; a) ADAPTIVE=1 ;; *) usage ;; esac
done
shift $((OPTIND - 1))
MODELS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do MODELS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ -n "$BASE" ] && [ -n "$OUT" ] && [ ${#MODELS[@]} -gt 0 ] || usage
[ -f "$BASE" ] || { echo "sweep: $BASE: no such base file (write it with kldtool base)" >&2; exit 2; }
KLD=$(kldtool_cmd)
mkdir -p "$OUT"
for m in "${MODELS[@]}"; do
  [ -d "$m" ] || is_hub_id "$m" || { echo "sweep: $m: not a model directory or hub id" >&2; exit 2; }
  [ -n "$ADAPTIVE" ] || compare_one "$OUT" "$(basename "${m%/}")" "$BASE" "$m" --engine vllm "$@"
done
[ -z "$ADAPTIVE" ] || adaptive_sweep "$OUT" "$BASE" "${MODELS[@]}" -- --engine vllm "$@"
finish_report "$OUT" "vLLM models vs $(basename "$BASE")"
