#!/usr/bin/env bash
# A one-off, never run by setup or CI: llama.cpp's CUDA build for one GPU architecture, from the
# llama.cpp tree vendored in the llama-cpp-python sdist that pyproject.toml pins, so that kldtool
# (through that version's Python bindings) and llama-perplexity run the same kernels.
#
# One CMake build gives both: the shared libraries (libllama.so and libggml*.so), which the
# bindings load where LLAMA_CPP_LIB_PATH points, and llama-perplexity and llama-quantize linked
# to them. That compiles ggml-cuda once; a wheel and a separate llama-perplexity would compile it
# twice.
#
#   bash scripts/build_cuda_llamacpp.sh --pack .gpu/llama.cpp.tar.xz   # here: the sources, stripped
#   bash scripts/build_cuda_llamacpp.sh --src .gpu/llama.cpp.tar.xz --out /tmp/llamacpp-cuda [--arch 90]
#   bash scripts/build_cuda_llamacpp.sh --src ... --out ... --dry-run  # configure only, print the arguments
#
# --pack downloads the sdist (the package registry) and keeps only what the build reads, plus
# gguf-py: about 4 MiB, small enough to travel to a lent GPU machine with no network. The build
# takes cuBLAS from the CUDA toolkit, else from the nvidia-cublas wheel in python3's site-packages
# (torch's; `pip install nvidia-cublas` where neither has it), and builds without CUDA's virtual
# memory management where the toolkit has no driver stub (a machine with no GPU). It writes
# OUT/env.sh, the environment the bindings need, and prints how long the build took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/llamacpp-build.sh
SRC="" OUT="" PACK="" DRY=0 JOBS=$(nproc)
ARCH=${KLDTOOL_CUDA_ARCHS:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --src) SRC=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --pack) PACK=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "build_cuda_llamacpp: unknown argument $1 (see the script's header)" >&2; exit 2 ;;
  esac
done
VER=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | cut -d= -f3)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ -n "$PACK" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$WORK"
  tar xzf "$WORK/llama_cpp_python-$VER.tar.gz" -C "$WORK"
  tree="$WORK/llama_cpp_python-$VER/vendor/llama.cpp"
  # What the build of the libraries, llama-perplexity and llama-quantize never reads: the other
  # backends, models, docs, tests, examples and the web UI.
  (cd "$tree" && rm -rf models docs tests examples pocs media benches tools/ui .github \
    && find ggml/src -maxdepth 1 -type d -name 'ggml-*' ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +)
  cp -r "$WORK/llama_cpp_python-$VER/llama_cpp" "$tree/llama_cpp"  # the bindings of the same version
  mkdir -p "$(dirname "$PACK")"
  tar cJf "$PACK" -C "$(dirname "$tree")" llama.cpp
  echo "build_cuda_llamacpp: packed llama.cpp of llama-cpp-python $VER into $PACK ($(du -h "$PACK" | cut -f1))"
  exit 0
fi

[ -n "$SRC" ] && [ -n "$OUT" ] || { echo "build_cuda_llamacpp: give --src (a --pack tarball or a tree) and --out" >&2; exit 2; }
if [ -f "$SRC" ]; then
  tar xJf "$SRC" -C "$WORK"
  SRC="$WORK/llama.cpp"
fi
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_cuda_llamacpp: $SRC holds no llama.cpp tree" >&2; exit 2; }
command -v nvcc >/dev/null || { echo "build_cuda_llamacpp: no nvcc on PATH" >&2; exit 2; }
[ -n "$ARCH" ] || ARCH=$(cuda_archs)

# cuBLAS: the toolkit's, else the wheel's (named as CMake's FindCUDAToolkit looks for it).
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
EXTRA=()
if ! ls "$CUDA_ROOT"/lib64/libcublas.so "$CUDA_ROOT"/targets/*/lib/libcublas.so >/dev/null 2>&1; then
  wheel=$(python3 -c 'import glob, os, sys; print(next(iter(sorted(p for s in sys.path for p in glob.glob(os.path.join(s, "nvidia/cu1*/lib/libcublas.so.*")))), ""))' 2>/dev/null || true)
  [ -n "$wheel" ] || { echo "build_cuda_llamacpp: no cuBLAS in $CUDA_ROOT nor in python3's nvidia-cublas wheel" >&2; exit 2; }
  libdir=$(dirname "$wheel")
  mkdir -p "$OUT/cublas"
  for lib in cublas cublasLt; do
    ln -sf "$(ls "$libdir"/lib$lib.so.* | head -n 1)" "$OUT/cublas/lib$lib.so"
  done
  EXTRA+=("-DCUDA_cublas_LIBRARY=$OUT/cublas/libcublas.so" "-DCUDA_cublasLt_LIBRARY=$OUT/cublas/libcublasLt.so"
          "-DCMAKE_CUDA_FLAGS=-I$(dirname "$libdir")/include" "-DCMAKE_CXX_FLAGS=-I$(dirname "$libdir")/include")
  RUNTIME_LIBS=$libdir
fi
# CUDA's virtual memory calls are linked through the toolkit's driver stub; where it has none
# (a machine with no GPU, or an image that mounts the driver elsewhere), ggml-cuda's memory pool
# uses plain allocations instead, which changes no result.
if ! ls "$CUDA_ROOT"/lib64/stubs/libcuda.so "$CUDA_ROOT"/targets/*/lib/stubs/libcuda.so >/dev/null 2>&1; then
  EXTRA+=("-DGGML_CUDA_NO_VMM=ON")
fi
read -r -a CPU <<<"$(llamacpp_cmake_args cpu)"
ARGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=on "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF
      ${CPU[@]+"${CPU[@]}"} ${EXTRA[@]+"${EXTRA[@]}"})
echo "build_cuda_llamacpp: llama-cpp-python $VER's llama.cpp, CUDA $(nvcc --version | grep -o 'release [0-9.]*'), arch $ARCH"
echo "cmake ${ARGS[*]}"
start=$(date +%s)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$OUT/build" ${GEN[@]+"${GEN[@]}"} "${ARGS[@]}" >"$OUT/configure.log" 2>&1 \
  || { tail -n 30 "$OUT/configure.log" >&2; exit 1; }
if [ "$DRY" = 1 ]; then
  echo "build_cuda_llamacpp: configured in $(($(date +%s) - start)) s (--dry-run: nothing built)"
  exit 0
fi
cmake --build "$OUT/build" --target llama llama-perplexity llama-quantize -j "$JOBS" >"$OUT/build.log" 2>&1 \
  || { grep -m 20 -B 2 -A 8 'error' "$OUT/build.log" >&2 || tail -n 40 "$OUT/build.log" >&2; exit 1; }
mkdir -p "$OUT/lib" "$OUT/bin" "$OUT/python"
find "$OUT/build" -name 'lib*.so*' -exec cp -P {} "$OUT/lib/" \;
cp "$OUT/build/bin/llama-perplexity" "$OUT/build/bin/llama-quantize" "$OUT/bin/"
# The same version's bindings and gguf-py, where the tree is a --pack tarball's.
[ -d "$SRC/llama_cpp" ] && cp -r "$SRC/llama_cpp" "$OUT/python/"
[ -d "$SRC/gguf-py/gguf" ] && cp -r "$SRC/gguf-py/gguf" "$OUT/python/"
cat >"$OUT/env.sh" <<ENV
export LLAMA_CPP_LIB_PATH=$OUT/lib
export LD_LIBRARY_PATH=$OUT/lib${RUNTIME_LIBS:+:$RUNTIME_LIBS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PYTHONPATH=$OUT/python\${PYTHONPATH:+:\$PYTHONPATH}
ENV
echo "build_cuda_llamacpp: built in $(($(date +%s) - start)) s with $JOBS jobs; libraries $(du -sh "$OUT/lib" | cut -f1)"
echo "build_cuda_llamacpp: source $OUT/env.sh to use them (llama-cpp-python's bindings, gguf-py, the libraries)"
