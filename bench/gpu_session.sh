#!/usr/bin/env bash
# One device-machine call (see /work/.library/device): build for Hopper, run the CUDA tests, a
# compute-sanitizer pass over them, and the GPU benchmarks next to the PyTorch peer. Logs and
# JSON go to $OUT (or ./gpu-out). Usage on the device: bash bench/gpu_session.sh [quick]
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }
nvidia-smi -L | tee -a "$out/summary.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DZO_BUILD_BENCH=ON > "$out/cmake.log" 2>&1 || { log "cmake failed"; tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" > "$out/build.log" 2>&1 || { log "build failed"; grep -E "error" "$out/build.log" | head -40; exit 1; }
log "build ok"
for t in test_gpu test_cuda_ops; do
  ./build-gpu/tests/$t > "$out/$t.log" 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/$t.log" | head -20
done
if [ "${1:-}" != quick ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 ./build-gpu/tests/test_cuda_ops \
      --gtest_filter='*Attention*:*LayerNorm*:*CrossEntropy*:*Embedding*' > "$out/sanitizer-$tool.log" 2>&1
    log "compute-sanitizer $tool rc=$? $(tail -1 "$out/sanitizer-$tool.log")"
  done
  ./build-gpu/bench/bench_train --device cuda --precision bf16 --mode resident \
    --models gpt2-124m --micro-batch 16 --steps 10 --json > "$out/bench_train.jsonl" 2>&1
  log "bench_train: $(cat "$out/bench_train.jsonl")"
  python3 bench/pytorch_gpt2.py --batch 16 --seq 1024 > "$out/pytorch.json" 2>"$out/pytorch.err"
  log "pytorch: $(cat "$out/pytorch.json")"
fi
