#!/usr/bin/env bash
# The offload engine on a GPU (issue 5), one device-machine call after bench/gpu_session.sh built
# build-gpu: pinned copy bandwidth, resident vs offload vs offload+DPU per-phase times and
# step/max(component), a trace, and the largest model that trains with offload but is refused
# resident. Logs to $OUT (or ./gpu-out). Usage on the device: bash bench/gpu_offload_session.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/offload_summary.txt"; }
B=./build-gpu/src/offload_train
[ -x "$B" ] || { cmake --build build-gpu -j "$(nproc)" > "$out/build.log" 2>&1 || { log "build failed"; exit 1; }; }
./build-gpu/bench/bench_copy --device cuda --sizes 1MiB,8MiB,32MiB,128MiB,512MiB --json \
  > "$out/bench_copy.jsonl" 2>&1
log "bench_copy: $(cat "$out/bench_copy.jsonl")"
run() {  # name, args...
  local name=$1; shift
  timeout 240 $B train --data synthetic --log-every 5 --eval-batches 1 --metrics "$out/$name.jsonl" "$@" \
    > "$out/$name.log" 2>&1
  log "$name rc=$? $(grep -E '^(done|per step|offload_train: error)' "$out/$name.log" | tr '\n' ' ')"
}
common=(--model gpt2-124m -b 16 --seq-len 1024 --steps 20 --precision bf16)
run resident_124m "${common[@]}" --mode resident
run offload_124m "${common[@]}" --mode offload
run offload_dpu_124m "${common[@]}" --mode offload --dpu --dpu-warmup 3
run offload_124m_accum "${common[@]}" --mode offload -b 4 --grad-accum 4
run offload_350m_trace --model gpt2-350m -b 8 --seq-len 1024 --steps 8 --precision bf16 \
  --mode offload --trace "$out/trace_350m.json"
# Largest: a model whose fp32 training state exceeds the GPU's memory.
$B plan --model gpt-6.7b -b 1 --seq-len 1024 --recompute --precision bf16 > "$out/plan_6.7b.txt" 2>&1
log "plan 6.7b rc=$? $(grep -E 'total|recommended' "$out/plan_6.7b.txt" | tr '\n' ' ')"
run resident_6.7b --model gpt-6.7b -b 1 --seq-len 1024 --recompute --steps 2 --mode resident
run offload_6.7b --model gpt-6.7b -b 1 --seq-len 1024 --recompute --steps 4 --mode offload \
  --optimizer-state fp32
run offload_dpu_6.7b --model gpt-6.7b -b 2 --seq-len 1024 --recompute --steps 6 --mode offload \
  --dpu --dpu-warmup 2
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$out/offload_summary.txt"
free -g >> "$out/offload_summary.txt"
