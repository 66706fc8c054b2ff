#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: install missing packages, build, report
# what the machine offers, and run the CPU Adam benchmark against a STREAM triad measured in the
# same run. Extra arguments go to the benchmark (e.g. --sizes 16M --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
./build/src/offload_train info
echo
./build/bench/bench_cpu_adam "$@"
