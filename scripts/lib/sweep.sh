# Shared by the sweep scripts (sourced, not run): find kldtool, compare one model unless its
# result exists, and write the report. A quant whose JSON result exists is never redone; an
# interrupted compare continues from its checkpoint (--state/--resume).

# usage: print the calling script's leading comment block and exit 2.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}

kldtool_cmd() {
  if [ -n "${KLDTOOL:-}" ]; then echo "$KLDTOOL"
  elif command -v kldtool >/dev/null 2>&1; then command -v kldtool
  else
    local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    [ -x "$here/.venv/bin/kldtool" ] || { echo "sweep: kldtool not found (set KLDTOOL or run scripts/setup.sh)" >&2; exit 2; }
    echo "$here/.venv/bin/kldtool"
  fi
}

# is_hub_id NAME: org/name (or org/name:file.gguf), as kldtool resolves it through the hub cache.
is_hub_id() {
  [[ ! -e "$1" && "$1" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+(:.+)?$ ]]
}

# compare_one OUTDIR LABEL BASEFILE MODEL [compare args...]
compare_one() {
  local out=$1 label=$2 base=$3 model=$4; shift 4
  if [ -f "$out/$label.json" ]; then
    echo "sweep: $label: done before ($out/$label.json), skipped" >&2
    return 0
  fi
  echo "sweep: $label: comparing $model" >&2
  "$KLD" compare --kl-divergence-base "$base" -m "$model" --json "$out/$label.json" \
    --per-token "$out/$label.h5" --state "$out/.$label.state" --resume "$@" > "$out/$label.txt"
}

# adaptive_sweep OUTDIR BASEFILE MODEL... [-- sweep args...]: one `kldtool sweep` over all the
# models (each scores only the windows its place in the ranking needs), its results in OUTDIR
# beside its state; re-running resumes it.
adaptive_sweep() {
  local out=$1 base=$2; shift 2
  local models=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=(-m "$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  echo "sweep: ranking ${#models[@]} models adaptively (kldtool sweep)" >&2
  "$KLD" sweep --kl-divergence-base "$base" "${models[@]}" -o "$out" "$@" > "$out/sweep.txt"
}

# finish_report OUTDIR TITLE: table (console, Markdown, CSV) and plots of every result there.
finish_report() {
  local out=$1 title=$2
  shopt -s nullglob
  local results=() f
  for f in "$out"/*.json; do [ "$(basename "$f")" = sweep.json ] || results+=("$f"); done
  shopt -u nullglob
  [ ${#results[@]} -gt 0 ] || { echo "sweep: no results in $out" >&2; return 1; }
  "$KLD" report "${results[@]}" --title "$title" --markdown "$out/report.md" --csv "$out/report.csv" --plots "$out/plots"
}
