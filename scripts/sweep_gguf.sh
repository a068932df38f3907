#!/usr/bin/env bash
# Quantize one GGUF into several types with llama-cpp-python and compare each against one base
# file, then write the report (table + plots). Re-running skips every quant already done.
#
#   scripts/sweep_gguf.sh -s MODEL.gguf|org/name:FILE.gguf -b BASE.kldt -o OUTDIR [-q "Q8_0 Q6_K Q4_K_M Q3_K_M Q2_K"]
#                         [-f TEXT -c CTX -n CHUNKS] [-a] [-- extra compare flags]
#
# -a ranks the quants with `kldtool sweep` instead: windows in one random order, each quant
# stopping once its place in the ranking is settled (extra flags then go to `kldtool sweep`).
#
# Without BASE.kldt the base file is first written from MODEL.gguf (use an F16/BF16 GGUF as the
# source) over TEXT (default: kldtool's built-in corpus) in chunks of CTX tokens (default 512),
# at most CHUNKS of them (default: all).
set -euo pipefail
. "$(dirname "$0")/lib/sweep.sh"
SRC= BASE= OUT= TEXT= CTX=512 CHUNKS= TYPES="Q8_0 Q6_K Q4_K_M Q3_K_M Q2_K" ADAPTIVE=
while getopts "s:b:o:q:f:c:n:ah" opt; do
  case $opt in
    s) SRC=$OPTARG ;; b) BASE=$OPTARG ;; o) OUT=$OPTARG ;; q) TYPES=$OPTARG ;;
    f) TEXT=$OPTARG ;; c) CTX=$OPTARG ;; n) CHUNKS=$OPTARG ;; a) ADAPTIVE=1 ;; *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ -n "$SRC" ] && [ -n "$BASE" ] && [ -n "$OUT" ] || usage
[ -f "$SRC" ] || is_hub_id "$SRC" || { echo "sweep: $SRC: no such GGUF file" >&2; exit 2; }
KLD=$(kldtool_cmd)
mkdir -p "$OUT"
if [ ! -f "$BASE" ]; then
  echo "sweep: writing the base file $BASE from $SRC" >&2
  "$KLD" base -m "$SRC" ${TEXT:+-f "$TEXT"} -c "$CTX" ${CHUNKS:+--chunks "$CHUNKS"} --kl-divergence-base "$BASE" --resume
fi
QUANTS=()
for t in $TYPES; do
  if [ ! -f "$OUT/$t.gguf" ] && { [ -n "$ADAPTIVE" ] || [ ! -f "$OUT/$t.json" ]; }; then
    "$KLD" quantize "$SRC" "$OUT/$t.gguf" "$t"
  fi
  QUANTS+=("$OUT/$t.gguf")
  [ -n "$ADAPTIVE" ] || compare_one "$OUT" "$t" "$BASE" "$OUT/$t.gguf" "$@"
done
[ -z "$ADAPTIVE" ] || adaptive_sweep "$OUT" "$BASE" "${QUANTS[@]}" -- "$@"
finish_report "$OUT" "$(basename "$SRC" .gguf): quants vs $(basename "$BASE")"
