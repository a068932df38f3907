# Sourced by scripts/setup.sh and scripts/build_cuda_llamacpp.sh: `llamacpp_cmake_args BACKEND`
# prints the CMake arguments llama.cpp is built with for one backend (cpu, cuda, metal, vulkan or
# rocm), or says in one line on stderr what is wrong and returns 2.
#
# Every x86-64 build keeps the CPU kernels at AVX2 (llamacpp-cmake-args): layers a GPU does not
# hold, and the whole of a CPU run, then compute the parity fixtures' numbers. The cpu backend's
# arguments are exactly that file's, so its wheel's cache key never changes.

_cpu_args() {
  [ "$(uname -m)" = x86_64 ] && cat "$(dirname "${BASH_SOURCE[0]}")/llamacpp-cmake-args"
  return 0
}

# The GPU architectures to build CUDA kernels for: KLDTOOL_CUDA_ARCHS, else those of the GPUs
# nvidia-smi lists (one build for this machine is several times shorter than for all), else the
# data-centre and workstation generations from Ampere to Hopper.
cuda_archs() {
  if [ -n "${KLDTOOL_CUDA_ARCHS:-}" ]; then
    echo "$KLDTOOL_CUDA_ARCHS"
    return
  fi
  local found=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    found=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' \
            | sort -u | paste -sd';' || true)
  fi
  echo "${found:-80;86;89;90}"
}

llamacpp_cmake_args() {
  local cpu
  cpu=$(_cpu_args)
  case "$1" in
    cpu) echo "$cpu" ;;
    cuda) echo "${cpu:+$cpu }-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$(cuda_archs)" ;;
    metal) echo "-DGGML_METAL=on" ;;
    vulkan) echo "${cpu:+$cpu }-DGGML_VULKAN=on" ;;
    rocm) echo "${cpu:+$cpu }-DGGML_HIP=on -DGPU_TARGETS=${KLDTOOL_ROCM_ARCHS:-gfx90a;gfx942;gfx1100}" ;;
    *)
      echo "setup: KLDTOOL_LLAMACPP=$1: one of cpu, cuda, metal, vulkan, rocm" >&2
      return 2
      ;;
  esac
}
