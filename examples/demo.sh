#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: install missing packages, build, then
# train the tiny demo GPT on the built-in synthetic task (host backend), resume it, score it on
# the held-out data, sample from it and export it. Everything lands in runs/demo/ (removed first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
bin=./build/src/offload_train
out=runs/demo
rm -rf "$out"
mkdir -p "$out"

$bin info
echo
$bin plan --model tiny -b 4 --seq-len 64
echo
# 300 steps: loss from ln(256) = 5.55 to about 1.2 (the task's floor is about 1.0 nats).
$bin train --model tiny --steps 300 -b 4 --seq-len 64 --lr 3e-3 --warmup 20 --log-every 25 \
  --eval-every 100 --checkpoint-dir "$out/ckpt" --checkpoint-every 100 \
  --metrics "$out/metrics.jsonl"
echo
# Continue from the newest checkpoint to step 350. The run's settings (batch, lr schedule, ...)
# come from the checkpoint; its lr schedule spans the first run's 300 steps, so steps 301..350 run
# at the final lr (--lr-schedule-steps would plan a longer one).
$bin train --checkpoint-dir "$out/ckpt" --resume latest --steps 350 --log-every 25 \
  --metrics "$out/metrics.jsonl"
echo
$bin eval --checkpoint latest --checkpoint-dir "$out/ckpt" --data synthetic --batches 8
echo "sampled continuation of tokens 1,2,3:"
$bin sample --checkpoint latest --checkpoint-dir "$out/ckpt" --prompt-tokens 1,2,3 -n 24 --ids
$bin export --checkpoint latest --checkpoint-dir "$out/ckpt" -o "$out/tiny.safetensors" --dtype bf16
echo "metrics: $out/metrics.jsonl; weights: $out/tiny.safetensors"
