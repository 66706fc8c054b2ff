#!/usr/bin/env bash
# Hostile inputs through the AddressSanitizer + UBSan binary (docs/testing.md, "ASan + UBSan
# job"): every seed and regression input of the fuzz corpora (tests/fuzz/corpus/), and damaged
# checkpoints and weights made here, through the commands a user gives them to (train, resume,
# export, eval, sample, plan, tokenize). Each command must end with exit status 0, 1, 2 or 3, a
# status 1 saying "offload_train: error:"; a sanitizer report, a crash, any other status or a
# command past INPUTS_TIMEOUT seconds (default 300) fails the job, naming the command.
#   usage: tests/run_asan_inputs.sh BUILD_DIR   (its offload_train and reseal_checkpoint)
#   INPUTS_VERBOSE=1 prints each command's status and first error line.
# tests/run_asan.sh runs it after the suites, with its ASAN_OPTIONS, UBSAN_OPTIONS, LSAN_OPTIONS.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1
bin=$build/src/offload_train
reseal=$build/tests/reseal_checkpoint
limit=${INPUTS_TIMEOUT:-300}
corpus=tests/fuzz/corpus
micro=$corpus/model_spec/micro.json
# A sanitizer's own exit status, apart from the program's 1 (error) and 2 (command line).
export ASAN_OPTIONS="${ASAN_OPTIONS:-} exitcode=86"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-} exitcode=86"
export LSAN_OPTIONS="${LSAN_OPTIONS:-} exitcode=86"

work=$(mktemp -d /tmp/zo_asan_inputs.XXXXXX)
trap 'rm -rf "$work"' EXIT
count=0
failed=0

run() {  # NAME ARGS...: offload_train ARGS, judged as above
  local name=$1 out rc why=""
  shift
  out=$(timeout "$limit" "$bin" "$@" 2>&1)
  rc=$?
  count=$((count + 1))
  if grep -qE "Sanitizer|runtime error:" <<<"$out"; then
    why="a sanitizer report"
  elif [[ $rc -eq 124 ]]; then
    why="ran past $limit s"
  elif [[ $rc -gt 3 ]]; then
    why="exit status $rc"
  elif [[ $rc -eq 1 ]] && ! grep -q "offload_train: error:" <<<"$out"; then
    why="exit status 1 without 'offload_train: error:'"
  fi
  [[ -n ${INPUTS_VERBOSE:-} ]] && echo "[$rc] $name: $(grep -m1 "error" <<<"$out")"
  if [[ -n $why ]]; then
    echo "run_asan_inputs: FAILED ($why): $name: offload_train $*"
    tail -n 60 <<<"$out"
    failed=$((failed + 1))
  fi
}

must() {  # ARGS...: setup that has to work
  if ! "$@" >"$work/setup.log" 2>&1; then
    echo "run_asan_inputs: setup failed: $*" >&2
    cat "$work/setup.log" >&2
    exit 1
  fi
}

# Checkpoints to damage: the micro model the fuzz seeds describe, and the tiny GPT-2.
small="-b 2 -q --device host --host-memory 4GiB"
# shellcheck disable=SC2086
must "$bin" train --model "$micro" --seq-len 4 $small --steps 2 --checkpoint-dir "$work/micro"
# shellcheck disable=SC2086
must "$bin" train --model tiny --seq-len 16 $small --steps 2 --checkpoint-dir "$work/tiny"

damaged() {  # BASE: a fresh copy of that checkpoint in its own --checkpoint-dir; prints its path
  rm -rf "$work/d"
  mkdir -p "$work/d"
  cp -r "$work/$1/step_00000002" "$work/d/"
  echo "$work/d/step_00000002"
}

reading() {  # NAME DIR SEQ: every command that reads a checkpoint
  local name=$1 dir=$2 seq=$3
  run "$name: resume" train --resume "$dir" --checkpoint-dir "$work/d" --steps 3 -q
  run "$name: export" export --checkpoint "$dir" -o "$work/export_$count.safetensors"
  run "$name: eval" eval --checkpoint "$dir" --data synthetic --batches 1 -b 2 --seq-len "$seq"
  run "$name: sample" sample --checkpoint "$dir" --prompt-tokens 1,2 -n 3 --ids
}

edit_json() {  # FILE PYTHON: runs PYTHON with the file's JSON as `s`, writes it back
  python3 - "$1" "$2" <<'PY'
import json, sys
path, code = sys.argv[1], sys.argv[2]
s = json.load(open(path))
exec(code)
json.dump(s, open(path, "w"), indent=2)
PY
}

set_weights() {  # FILE NAME_PART VALUE: every value of the first fp32 tensor whose name has it
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
path, part, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
name = sorted(k for k in header if part in k)[0]
begin, end = header[name]["data_offsets"]
count = (end - begin) // 4
data[8 + n + begin:8 + n + end] = struct.pack("<%df" % count, *([value] * count))
open(path, "wb").write(data)
PY
}

start=$SECONDS
# ---- the fuzz corpora -------------------------------------------------------------------------
for f in "$corpus"/model_spec/*; do
  run "model spec $f: plan" plan --model "$f" --host-memory 4GiB --device-memory 1GiB
  # shellcheck disable=SC2086
  run "model spec $f: train" train --model "$f" --seq-len 4 $small --steps 1
done
for f in "$corpus"/shard/*; do
  # shellcheck disable=SC2086
  run "shard $f: train" train --model "$micro" --data "$f" --seq-len 4 $small --steps 1
  run "shard $f: eval" eval --checkpoint "$work/micro/step_00000002" --data "$f" -b 2 --seq-len 4
done
for f in "$corpus"/safetensors/*; do
  # shellcheck disable=SC2086
  run "weights $f: train" train --init-from "$f" --model "$micro" --seq-len 4 $small --steps 1
  run "weights $f: eval" eval --init-from "$f" --model "$micro" --data synthetic -b 2 \
    --seq-len 4 --batches 1
  run "weights $f: sample" sample --init-from "$f" --model "$micro" --prompt-tokens 1 -n 2 --ids
done
for f in "$corpus"/hf_index/*; do
  rm -rf "$work/hf"
  mkdir -p "$work/hf"
  cp "$f" "$work/hf/model.safetensors.index.json"
  # Every shard it names that could lie beside it, as the micro model's weights.
  python3 - "$f" "$work/hf" "$corpus/safetensors/micro_f32.safetensors" <<'PY'
import json, os, re, shutil, sys
text = open(sys.argv[1], errors="replace").read()
for name in set(re.findall(r'"([^"/\\]+\.safetensors)"', text)):
    shutil.copy(sys.argv[3], os.path.join(sys.argv[2], name))
PY
  # shellcheck disable=SC2086
  run "index $f: train" train --init-from "$work/hf" --model "$micro" --seq-len 4 $small --steps 1
  run "index $f: sample" sample --init-from "$work/hf" --model "$micro" --prompt-tokens 1 -n 1
done
for f in "$corpus"/manifest/*; do
  d=$(damaged micro)
  cp "$f" "$d/MANIFEST.json"
  reading "manifest $f" "$d" 4
done
for f in "$corpus"/trainer_state/*; do
  d=$(damaged micro)
  cp "$f" "$d/trainer_state.json"
  must "$reseal" "$d"
  reading "trainer_state.json $f" "$d" 4
done
for f in "$corpus"/loader_state/*; do
  d=$(damaged micro)
  edit_json "$d/trainer_state.json" "s['data'] = json.load(open('$f'))"
  must "$reseal" "$d"
  run "data cursor $f: resume" train --resume "$d" --checkpoint-dir "$work/d" --steps 3 -q
done
printf 'Hello, world! Tokenizers meet text.\n\nA second paragraph, 123.\n' >"$work/text.txt"
for f in "$corpus"/tokenizer/*; do
  run "tokenizer $f" tokenize --tokenizer "$f" --output-dir "$work/tok" --force "$work/text.txt"
done

# ---- regressions: what hostile inputs once did ------------------------------------------------
d=$(damaged tiny)  # a loss scale of 1e-46 is 0 as a float: it failed mid-step and freed in use
edit_json "$d/trainer_state.json" "s['loss_scaler']['scale'] = 1e-46"
must "$reseal" "$d"
reading "loss scale 1e-46" "$d" 16
for v in nan inf 3e38; do  # NaN/Inf weights, and finite ones that overflow in use
  d=$(damaged tiny)
  set_weights "$d/model.safetensors" "mlp.c_fc.weight" "$v"
  must "$reseal" "$d"
  reading "weights $v" "$d" 16
  run "weights $v: greedy sample" sample --checkpoint "$d" --prompt-tokens 1 -n 2 --temperature 0
done
for i in 17 90 200; do  # a manifest changed after it was written
  d=$(damaged tiny)
  python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[$i]^=1; \
open(p,'wb').write(b)" "$d/MANIFEST.json"
  reading "MANIFEST.json byte $i flipped" "$d" 16
done
export ZO_TEST_ERROR_STEP=2  # an error mid-step, while the streams still run it
for mode in offload resident; do
  run "error mid-step, $mode" train --model tiny --seq-len 64 -b 8 -q --device host --steps 3 \
    --mode "$mode"
done
unset ZO_TEST_ERROR_STEP

echo "run_asan_inputs: $count commands in $((SECONDS - start)) s, $failed failed"
[[ $failed -eq 0 ]]
