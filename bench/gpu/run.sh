#!/usr/bin/env bash
# One device-machine call, one answer (docs/gpu.md): runs PHASEs from the bundle built by
# bench/gpu/bundle.sh, every step under its own timeout, and leaves at most four files in $OUT:
# gpu_report.md (the summary), results.json (every step's figures), logs.tar.gz (every log), and
# trace.json when a phase writes one. A failing step is recorded and the next one runs.
#   bash gpu-bundle/run.sh check [resident] [offload] [big]
# ZO_DEADLINE_S (default 480): seconds the whole call may take; each step's timeout is cut to what
# is left of it (less 20 s for the report), and a step with under 20 s left is skipped (rc 125),
# so a call stopped by the deadline still ends with its report.
# ZO_SKIP: a regular expression of step names not to run (rc 125), for figures an earlier call
# already measured, so that a short lease reaches the new ones.
# Phases: check (device, GPU tests, a GPT-2 124M step against the host backend, then paths:
# checkpoint, resume, sample, eval and fp16 overflow steps on a small model), sanitize
# (compute-sanitizer memcheck and racecheck over the op tests and two tiny trainings), resident
# (GPT-2 124M bf16 and fp16), profile (Nsight Compute's GPU time of every kernel of one 124M
# step, grouped as the predicted budget), offload (350M/774M/1.5B, with and without DPU, vs resident),
# stream (parameter streaming: GPT-2 1.5B with a window of 3 blocks against resident and
# offload at the same batch, Llama 3.1 8B streamed in 16 GiB of device memory against offload),
# drive (the optimizer state on the machine's drive: bench_state_dir, Llama 3.1 8B in 48 GiB of
# host memory against the same run in memory), big (the largest model the plan admits here), llama (the Llama family: a tiny Llama against
# the host backend, Llama 3.2 1B resident, Llama 3.1 8B offloaded with DPU).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu-out}
[ $# -gt 0 ] || { echo "usage: run.sh check|paths|sanitize|resident|profile|offload|stream|drive|big|llama ..." >&2; exit 2; }
for p in "$@"; do
  case $p in check | paths | sanitize | resident | profile | offload | stream | drive | big | llama) ;; *) echo "run.sh: unknown phase '$p' (check, paths, sanitize, resident, profile, offload, stream, drive, big, llama)" >&2; exit 2 ;; esac
done
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "run.sh: no NVIDIA GPU here (nvidia-smi missing or found none); run it on the GPU machine" >&2
  exit 1
fi
logs=$(mktemp -d /tmp/zo-gpu-logs.XXXXXX)
mkdir -p "$out"
report=$out/gpu_report.md
results=$logs/results.jsonl
. "$here/env.sh" > "$logs/env.log" 2>&1
. "$here/check_step.sh"
B=$here/bin/offload_train
T0=$(date +%s)
deadline=${ZO_DEADLINE_S:-480}

# Rewritten after every step, so that a call cut off at its limit still returns a report.
finish() {
  python3 "$here/summarize.py" "$results" "$report" "$out/results.json" "$logs" > /dev/null
  tar -C "$logs" -czf "$out/logs.tar.gz" .
}

# step NAME TIMEOUT_S CMD...: runs CMD, records rc, seconds and the log's name.
step() {
  local name=$1 limit=$2; shift 2
  local t0 rc left
  t0=$(date +%s.%N)
  left=$(( deadline - 20 - ($(date +%s) - T0) ))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (limit ${limit}s, $(( $(date +%s) - T0 ))s into the call)"
  if [ -n "${ZO_SKIP:-}" ] && [[ $name =~ $ZO_SKIP ]]; then
    echo "skipped: ZO_SKIP='$ZO_SKIP'" > "$logs/$name.log"
    rc=125
  elif [ "$limit" -lt 20 ]; then
    echo "skipped: the call's deadline (ZO_DEADLINE_S=$deadline) is near" > "$logs/$name.log"
    rc=125
  else
    timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
    rc=$?
  fi
  printf '{"step":"%s","rc":%d,"seconds":%.1f,"limit":%d,"cmd":"%s"}\n' "$name" "$rc" \
    "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b - a}')" "$limit" "$(echo "$*" | sed 's/"/\\"/g')" >> "$results"
  tail -3 "$logs/$name.log" | sed 's/^/   /'
  finish
  return $rc
}

# Peak GPU memory of a step: nvidia-smi sampled every 100 ms into NAME.mem.
# Peak host memory: the resident set of every offload_train process, summed, sampled every
# 500 ms; the largest sum (KiB) in NAME.rss.
with_mem() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$logs/$name.mem" 2>/dev/null &
  local smi=$!
  (
    peak=0
    while :; do
      r=$(ps -C offload_train -o rss= 2>/dev/null | awk '{s += $1} END {print s + 0}')
      [ "$r" -gt "$peak" ] && { peak=$r; echo "$peak" > "$logs/$name.rss"; }
      sleep 0.5
    done
  ) &
  local rss=$!
  step "$name" "$@"
  local rc=$?
  kill $smi $rss 2>/dev/null; wait $smi $rss 2>/dev/null
  return $rc
}

# A GoogleTest binary under one timeout; if it hangs or crashes, each test it did not finish runs
# again alone under its own timeout, so one bad test costs one row, not the rest of the binary.
gtest_run() {
  local bin=$1 limit=$2 t
  step "$bin" "$limit" "$here/bin/$bin"
  case $? in 0 | 1) return ;; esac
  "$here/bin/$bin" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}' > "$logs/$bin.list"
  for t in $(cat "$logs/$bin.list"); do
    grep -qE "^\[ *(OK|FAILED|SKIPPED) *\] $t " "$logs/$bin.log" && continue
    step "$bin.$(echo "$t" | tr '/' '_')" 60 "$here/bin/$bin" --gtest_filter="$t"
  done
}

train() {  # train NAME LIMIT ARGS...: offload_train train on the synthetic task, metrics kept
  local name=$1 limit=$2; shift 2
  with_mem "$name" "$limit" "$B" train --data synthetic --eval-batches 1 --log-every 5 \
    --metrics "$logs/$name.metrics" "$@"
}

phase_check() {
  # lscpu: the host's CPU (vendor, cores per socket, threads per core) decides what bounds CPU
  # Adam's codecs (vector ports, SMT), which the cpu_adam_roofline step measures.
  step device_info 60 bash -c "nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60; lscpu; $B info"
  gtest_run test_gpu 120
  gtest_run test_pinned_memory 120
  gtest_run test_cuda_ops 240
  # The same GPT-2 124M step (weights, data) on the GPU in bf16 and fp32 (the fp32 logits GEMM
  # with ld = vocab at N = B*T = 16384) and on the host backend: summarize.py compares the losses.
  local one=("${check_step[@]}")
  ZO_SYNC_EACH_OP=1 train check_124m_cuda_bf16_sync 180 "${one[@]}" --device cuda --precision bf16
  train check_124m_cuda_bf16 120 "${one[@]}" --device cuda --precision bf16
  train check_124m_cuda_fp32 120 "${one[@]}" --device cuda --precision fp32
  # The host backend's step is computed where the bundle was built (bundle.sh, ref/): on the
  # device machine it cost 160 s of the lease.
  if [ -f "$here/ref/check_124m_host_fp32.metrics" ]; then
    cp "$here/ref/check_124m_host_fp32.metrics" "$logs/"
    step check_124m_host_fp32 20 cat "$here/ref/check_124m_host_fp32.log"
  else
    train check_124m_host_fp32 300 "${one[@]}" --device host --precision fp32
  fi
  phase_paths
}

phase_paths() {
  # Checkpoint and resume (summarize.py compares the resumed steps with the run that wrote the
  # checkpoint: the resumed run takes its timed GEMM algorithm choices from it, so the bits agree
  # with autotuning on), sample, and fp16 overflow steps. GPT-2 124M at a small batch, where
  # cuBLASLt offers several candidates and the choices are timed.
  local ck=/tmp/zo-gpu-ckpt mode
  for mode in resident offload; do
    local s=(--model gpt2-124m -b 4 --seq-len 256 --device cuda --precision bf16 --seed 3
             --lr 1e-3 --warmup 2 --mode "$mode")
    rm -rf "$ck.$mode"
    train "ckpt_$mode" 60 "${s[@]}" --steps 6 --checkpoint-dir "$ck.$mode" --checkpoint-every 3
    train "resume_$mode" 60 "${s[@]}" --steps 6 --checkpoint-dir "$ck.$mode" \
      --resume "$ck.$mode/step_00000003"
  done
  step sample_cuda 60 "$B" sample --checkpoint latest --checkpoint-dir "$ck.resident" -n 16 --ids
  step eval_cuda 60 "$B" eval --checkpoint latest --checkpoint-dir "$ck.resident" --data synthetic \
    -b 4 --seq-len 128 --batches 4 --device cuda
  train fp16_overflow 60 --model small-test -b 4 --seq-len 128 --device cuda --precision fp16 \
    --loss-scale 1e30 --steps 3
}

phase_sanitize() {
  local cs=(compute-sanitizer --error-exitcode 9 --print-limit 20)
  step memcheck_ops 120 "${cs[@]}" --tool memcheck "$here/bin/test_cuda_ops" --gtest_filter='Dtypes/*'
  step racecheck_ops 120 "${cs[@]}" --tool racecheck "$here/bin/test_cuda_ops" \
    --gtest_filter='Dtypes/*Attention*_bf16:Dtypes/*LayerNorm*_bf16:Dtypes/*CrossEntropy*_bf16:Dtypes/*Embedding*_bf16'
  local m=(train --model small-test -b 2 --steps 3 --data synthetic --eval-batches 1 --device cuda)
  step memcheck_train_resident 120 "${cs[@]}" --tool memcheck "$B" "${m[@]}" --mode resident
  step memcheck_train_offload 120 "${cs[@]}" --tool memcheck "$B" "${m[@]}" --mode offload --dpu \
    --dpu-warmup 1 --grad-accum 2
}

phase_resident() {
  local m=(--model gpt2-124m -b 16 --seq-len 1024 --steps 33 --device cuda --mode resident)
  step bench_train_124m_bf16 180 "$here/bin/bench_train" --device cuda --precision bf16 \
    --mode resident --models gpt2-124m --micro-batch 16 --seq-len 1024 --steps 30 --json
  train resident_124m_bf16 180 "${m[@]}" --precision bf16
  train resident_124m_fp16 180 "${m[@]}" --precision fp16
  # CUDA Graphs' share: the same step launched kernel by kernel, and a small micro-batch where
  # launches weigh most, both ways.
  train resident_124m_bf16_eager 180 "${m[@]}" --precision bf16 --no-cuda-graphs
  local small=(--model gpt2-124m -b 1 --seq-len 256 --steps 60 --device cuda --mode resident)
  train resident_124m_b1_graphs 120 "${small[@]}" --precision bf16
  train resident_124m_b1_eager 120 "${small[@]}" --precision bf16 --no-cuda-graphs
  # Generation at micro-batch 1 (KV cache, split decode attention): a checkpoint, then 512 tokens.
  local ck=/tmp/zo-gpu-ckpt.124m
  rm -rf "$ck"
  train sample_ckpt_124m 120 --model gpt2-124m -b 4 --seq-len 256 --steps 2 --device cuda \
    --checkpoint-dir "$ck"
  step sample_124m_bf16 120 "$B" sample --checkpoint latest --checkpoint-dir "$ck" --device cuda \
    --prompt-tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 512 --temperature 0 --ids --timing
  # The peer: the same GPT-2 in PyTorch (torch.compile, bf16 autocast, fused AdamW), if present.
  step pytorch_124m 300 python3 "$here/pytorch_gpt2.py" --batch 16 --seq 1024 --steps 30
}

phase_profile() {
  # The GPU time of every kernel of the third resident GPT-2 124M step (the first two time the
  # cuBLASLt candidates and record the graphs), as docs/performance.md's predicted budget groups
  # them. The trainer names each step's NVTX range "step N". Clocks left alone (--clock-control
  # none): the step runs at the clocks a user gets.
  command -v ncu > /dev/null || { echo "profile: no ncu here, phase skipped"; return; }
  step ncu_124m 180 ncu --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum --nvtx --nvtx-include "step 3/" \
    --log-file "$logs/ncu_124m.csv" "$B" train --model gpt2-124m -b 16 --seq-len 1024 \
    --steps 4 --device cuda --mode resident --precision bf16 --data synthetic --eval-batches 1
  step kernel_profile_124m 60 python3 "$here/kernel_profile.py" "$logs/ncu_124m.csv" \
    "$logs/ncu_124m.log"
}

phase_offload() {
  step bench_copy 90 "$here/bin/bench_copy" --device cuda --sizes 8MiB,32MiB,128MiB,512MiB --json
  # The host's memory roofline (a triad on every core) and CPU Adam alone on every core: the
  # yardsticks for CPU Adam inside the offloaded step (summarize.py's targets).
  step cpu_adam_roofline 180 "$here/bin/bench_cpu_adam" --sizes 256M --grad-dtype bf16 \
    --state-dtype fp32,bf16,q8 --master fp32,bf16 --isa avx512bf16 --json
  # fp32 and q8 state again on one thread per physical core: whether SMT siblings add to q8's
  # compute-bound codec or only share its vector ports (with lscpu, what bounds the q8 target).
  local cores
  cores=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  step cpu_adam_cores 90 "$here/bin/bench_cpu_adam" --sizes 256M --grad-dtype bf16 \
    --state-dtype fp32,q8 --isa avx512bf16 --threads "${cores:-0}" --json
  # ZO_OFFLOAD_MODELS: the sizes (default the target's 1.5B alone; 350M and 774M were measured
  # on 2026-11-24 and cost a minute of the lease).
  local model
  for model in ${ZO_OFFLOAD_MODELS:-gpt2-1558m}; do
    local m=(--model "$model" -b 8 --seq-len 1024 --steps 12 --device cuda --precision bf16)
    train "resident_${model#gpt2-}" 120 "${m[@]}" --mode resident
    train "offload_${model#gpt2-}" 150 "${m[@]}" --mode offload
    train "offload_dpu_${model#gpt2-}" 150 "${m[@]}" --mode offload --dpu --dpu-warmup 3
  done
  # The smaller host formats at the size where CPU Adam limits the step: 8-bit state, and with it
  # a bf16 master (6 host bytes per parameter; uploads straight from the master).
  local big=(--model gpt2-1558m -b 8 --seq-len 1024 --steps 12 --device cuda --precision bf16)
  train offload_dpu_q8_1558m 150 "${big[@]}" --mode offload --dpu --dpu-warmup 3 \
    --optimizer-state q8
  # bf16 state moves 20 bytes per parameter against fp32's 28, and ran fastest on 16 cores
  # (2026-11-27): the configuration that can put CPU Adam under the GPU's step.
  train offload_dpu_bf16_1558m 150 "${big[@]}" --mode offload --dpu --dpu-warmup 3 \
    --optimizer-state bf16
  train offload_dpu_q8_bf16master_1558m 150 "${big[@]}" --mode offload --dpu --dpu-warmup 3 \
    --optimizer-state q8 --master-weights bf16
  # bf16 master and bf16 state: 14 bytes moved per parameter (the uploads read the master), half
  # of fp32's 28, at 1.24 cycles per parameter of compute on the VM: memory-bound on 16 cores if
  # the stochastic rounding keeps up there (2026-11-27: q8 with a bf16 master did not).
  train offload_dpu_bf16_bf16master_1558m 150 "${big[@]}" --mode offload --dpu --dpu-warmup 3 \
    --optimizer-state bf16 --master-weights bf16
  train trace_350m 120 --model gpt2-350m -b 8 --seq-len 1024 --steps 6 --device cuda \
    --precision bf16 --mode offload --trace "$out/trace.json" --overwrite
}

phase_stream() {
  # The batch hides the copies by plan's prediction (8192 tokens per micro-batch >= 7273).
  local m=(--model gpt2-1558m -b 8 --seq-len 1024 --steps 12 --device cuda --precision bf16)
  # The offload phase runs the same resident and offloaded steps: taken from it when it ran.
  [ -f "$logs/resident_1558m.metrics" ] || train resident_1558m 120 "${m[@]}" --mode resident
  [ -f "$logs/offload_1558m.metrics" ] || train offload_1558m 150 "${m[@]}" --mode offload
  train stream_1558m 150 "${m[@]}" --mode stream --param-window 3
  local big=(--model llama3.1-8b -b 2 --seq-len 4096 --recompute --precision bf16
    --optimizer-state bf16)
  step plan_llama_8b_stream 60 "$B" plan "${big[@]}" --mode stream --device-memory 16GiB
  train llama_8b_offload 300 "${big[@]}" --steps 4 --device cuda --mode offload
  train llama_8b_stream 300 "${big[@]}" --steps 4 --device cuda --mode stream \
    --device-memory 16GiB
  # A 13B model streamed in 24 GiB, 6 host bytes per parameter (73 GiB by the plan).
  train gpt_13b_stream 300 --model gpt-13b -b 4 --seq-len 2048 --recompute --precision bf16 \
    --optimizer-state q8 --master-weights bf16 --steps 4 --device cuda --mode stream \
    --device-memory 24GiB
}

phase_drive() {
  # The optimizer state on the machine's drive (--state-dir): the drive's own rates (info's probe),
  # the update against them, then Llama 3.1 8B offloaded in 48 GiB of host memory against the
  # same run in memory. The directory is on the bundle's disk (ZO_STATE_DIR), not a tmpfs /tmp.
  local d=${ZO_STATE_DIR:-$here/state}
  mkdir -p "$d"
  step info_state_dir 60 bash -c "df -hT $d; $B info --state-dir $d"
  step bench_state_dir 120 "$here/bin/bench_state_dir" --dir "$d" --model gpt2-1558m \
    --state q8 --steps 2 --json
  local shape=(--model llama3.1-8b -b 1 --seq-len 2048 --grad-accum 8 --precision bf16
    --optimizer-state q8 --master-weights bf16 --mode offload --dpu)
  step plan_llama_8b_state_dir 60 "$B" plan "${shape[@]}" --host-memory 48GiB --state-dir "$d" \
    --drive-rate 1.8
  local big=("${shape[@]}" --device cuda --steps 4 --dpu-warmup 2)
  train llama_8b_memory 150 "${big[@]}"
  train llama_8b_state_dir 300 "${big[@]}" --host-memory 48GiB --state-dir "$d"
}

phase_big() {
  local m=(--model gpt-6.7b -b 2 --seq-len 1024 --recompute --precision bf16 --optimizer-state bf16)
  step plan_6.7b 60 "$B" plan "${m[@]}"
  train big_6.7b 420 "${m[@]}" --device cuda --mode offload --steps 5 --dpu --dpu-warmup 2
}

phase_llama() {
  # The same tiny Llama steps on the GPU (fp32) and the host backend: losses must agree.
  local tiny=(--model tiny-llama -b 4 --seq-len 128 --steps 4 --seed 3 --mode resident)
  train llama_tiny_cuda_fp32 90 "${tiny[@]}" --device cuda --precision fp32
  train llama_tiny_host 90 "${tiny[@]}" --device host
  local one=(--model llama3.2-1b -b 4 --seq-len 2048 --steps 12 --device cuda --precision bf16)
  train llama_1b_resident 180 "${one[@]}" --mode resident
  # The peer: the same Llama in plain PyTorch (SDPA, bf16 autocast, fused AdamW); summarize.py
  # compares its first loss with offload_train's.
  step pytorch_llama_1b 180 python3 "$here/pytorch_llama.py" --batch 4 --seq 2048 --steps 12
  train llama_1b_offload_dpu 180 "${one[@]}" --mode offload --dpu --dpu-warmup 3
  train llama_1b_offload_dpu_bf16 180 "${one[@]}" --mode offload --dpu --dpu-warmup 3 \
    --optimizer-state bf16
  train llama_1b_offload 180 "${one[@]}" --mode offload
  # The largest model at full speed: 8 micro-batches per step hide CPU Adam behind the GPU.
  # 8-bit state: 90 GiB of host memory by the plan (bf16 state's 105 GiB is too close to 128).
  local big=(--model llama3.1-8b -b 1 --seq-len 2048 --grad-accum 8 --precision bf16
    --optimizer-state q8)
  step plan_llama_8b 60 "$B" plan "${big[@]}" --mode offload --dpu
  train llama_8b_offload_dpu 300 "${big[@]}" --device cuda --mode offload --steps 6 --dpu \
    --dpu-warmup 2
}

for p in "$@"; do
  echo "=== phase $p"
  t=$(date +%s)
  "phase_$p"
  echo "{\"step\":\"phase_$p\",\"rc\":0,\"seconds\":$(( $(date +%s) - t )),\"limit\":480,\"cmd\":\"\"}" >> "$results"
done
finish
cat "$report"
