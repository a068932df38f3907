#!/usr/bin/env bash
# A separate environment for lm-evaluation-harness, the outside reference of --protocol rolling.
# Its dependencies (datasets, pandas, scikit-learn, ...) stay out of kldtool's .venv; it sees
# .venv's packages through a .pth line, so torch and transformers are the very same builds
# kldtool runs (the comparison is of protocols, not of two torch installs).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || { echo "scripts/lmeval/setup.sh: run scripts/setup.sh first" >&2; exit 2; }
[ -x .venv-lmeval/bin/python ] || "$PY" -m venv .venv-lmeval
SITE=$(.venv-lmeval/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/kldtool-main-venv.pth"
.venv-lmeval/bin/python -m pip install -q --upgrade pip
.venv-lmeval/bin/python -m pip install -q -c .venv/constraints.txt "lm_eval==0.4.13"
.venv-lmeval/bin/python -c "import lm_eval, torch, transformers; print('lm_eval', lm_eval.__version__ if hasattr(lm_eval, '__version__') else '0.4.13', '| torch', torch.__version__)"
