#!/usr/bin/env bash
# Installs missing Debian packages, builds everything (CUDA code too when nvcc is present) and runs
# the whole test suite. Exits non-zero on any failure. GPU tests skip, with a reason, without a GPU.
#   BUILD_DIR   build directory (default: build)
#   CMAKE_ARGS  extra configure arguments, e.g. "-DZO_SANITIZE=thread"
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
build_dir=${BUILD_DIR:-build}
jobs=$(nproc)
args=(-DCMAKE_BUILD_TYPE=Release)
# CI has no GPU: there the kernels are compiled, not run, so for Hopper only (no kernel branches on
# the architecture; the default Ampere + Hopper doubles the nvcc time).
if [[ ${CI:-} == true && ${CMAKE_ARGS:-} != *CMAKE_CUDA_ARCHITECTURES* ]]; then
  args+=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" "${args[@]}" ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
