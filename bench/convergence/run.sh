#!/usr/bin/env bash
# Convergence study of the optimizer formats: does training with bf16 or 8-bit (q8) Adam state,
# or bf16 master weights with stochastic rounding, reach the fp32 baseline's validation loss?
# A small GPT-2 and a small Llama (byte vocabulary, bench/convergence/*_bytes.json) train for
# $STEPS steps on English text with each format: same seed, same data order, same
# hyperparameters; only the format flags differ. See docs/convergence.md.
#
# Text: the fortune cookies of Debian's packages `fortunes` and `fortunes-min`
# (/usr/share/games/fortunes/*, 2.5 MB of quotations, jokes, poems and definitions; `ascii-art`
# left out). Install them with: apt-get install -y fortunes
# Plot: gnuplot (apt-get install -y gnuplot-nox).
#
# Usage: nice -n 10 bash bench/convergence/run.sh [OUT_DIR]     (default runs/convergence)
# Environment: OFFLOAD_TRAIN (the binary; build/src/offload_train), STEPS (2000),
#   EVAL_EVERY (100), MODELS ("gpt2 llama"),
#   CONFIGS ("fp32 bf16 q8 bf16sr bf16sr_q8 fp32_seed2"),
#   RESULTS (bench/convergence/results: the small CSVs and summary that are committed),
#   IMAGES (docs/images: the SVGs).
# Exit status: 0 when every config that ran is within 1% of fp32, 1 otherwise or on an error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${OFFLOAD_TRAIN:-$root/build/src/offload_train}
out=${1:-$root/runs/convergence}
steps=${STEPS:-2000}
eval_every=${EVAL_EVERY:-100}
models=${MODELS:-"gpt2 llama"}
configs=${CONFIGS:-"fp32 bf16 q8 bf16sr bf16sr_q8 fp32_seed2"}
results=${RESULTS:-$here/results}
images=${IMAGES:-$root/docs/images}
fortunes=/usr/share/games/fortunes

die() { echo "run.sh: $*" >&2; exit 1; }

# Check everything needed before the first (long) run.
[ -x "$bin" ] || die "no $bin: build it first (cmake --build build --target offload_train)"
if [ ! -f "$fortunes/literature" ] || [ ! -f "$fortunes/fortunes" ]; then
  die "the text comes from Debian's package 'fortunes' (and 'fortunes-min'), missing here:" \
      "apt-get install -y fortunes"
fi
command -v gnuplot >/dev/null || die "gnuplot draws the plot, missing here: apt-get install -y gnuplot-nox"

# The flags that make each config; everything else is the same for all. fp32_seed2 is not a
# format but a yardstick: fp32 with another seed (another init and data order) shows how far
# apart two equally good runs end, against which a format's difference can be judged.
flags_of() {
  case $1 in
    fp32) echo "--optimizer-state fp32 --seed 1337" ;;
    bf16) echo "--optimizer-state bf16 --seed 1337" ;;
    q8) echo "--optimizer-state q8 --seed 1337" ;;
    bf16sr) echo "--master-weights bf16 --optimizer-state fp32 --seed 1337" ;;
    bf16sr_q8) echo "--master-weights bf16 --optimizer-state q8 --seed 1337" ;;
    fp32_seed2) echo "--optimizer-state fp32 --seed 2" ;;
    *) die "unknown config '$1'" ;;
  esac
}
spec_of() { echo "$here/$1_bytes.json"; }

mkdir -p "$out" "$results" "$images"
data=$out/data
mkdir -p "$data"

# (a) The text. Every 20th fortune (5%) goes to the validation text, the rest to training.
# The package's file list fixes the corpus: other fortunes-* packages add files to the same
# directory. BEL and backspace (old overstrike) are dropped; everything else is kept as is.
mapfile -t files < <(dpkg -L fortunes-min fortunes | grep -E "^$fortunes/[^/]+$" |
  grep -vE '\.(dat|u8)$|/ascii-art$' | LC_ALL=C sort)
awk -v val="$data/val.txt" -v train="$data/train.txt" 'BEGIN { RS = "\n%\n" }
  { gsub(/[\007\010]/, ""); n++; printf "%s\n\n", $0 > ((n % 20 == 0) ? val : train) }' "${files[@]}"
echo "text: ${#files[@]} files of $fortunes ($(dpkg-query -W -f '${Package} ${Version}' fortunes)):" \
  "train $(wc -c < "$data/train.txt") bytes, val $(wc -c < "$data/val.txt") bytes," \
  "sha256 $(cat "$data/train.txt" "$data/val.txt" | sha256sum | cut -c1-16)"

# (b) Tokens. A byte-level BPE tokenizer.json with no merges: ids 0-255 are the bytes, 256 is
# <|endoftext|> (the document token). Byte ids keep the models small enough for 2 cores; no
# download is needed. GPT-2's ByteLevel alphabet: printable bytes map to themselves, the other
# 68 to U+0100, U+0101, ... in order.
{
  printf '{"version": "1.0", "normalizer": null,\n'
  printf ' "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},\n'
  printf ' "decoder": {"type": "ByteLevel"},\n "model": {"type": "BPE", "merges": [], "vocab": {'
  k=0 sep=""
  for b in $(seq 0 255); do
    if (((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)); then
      cp=$b
    else
      cp=$((256 + k))
      k=$((k + 1))
    fi
    printf '%s"\\u%04x": %d' "$sep" "$cp" "$b"
    sep=", "
  done
  printf '}},\n "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": true}]}\n'
} > "$data/bytes_tokenizer.json"
# The val text is the first document, so --val-docs 1 makes it the val split.
"$bin" tokenize --tokenizer "$data/bytes_tokenizer.json" --output-dir "$data/shards" \
  --name fortunes --val-docs 1 --force "$data/val.txt" "$data/train.txt"
train_bin=$data/shards/fortunes_train_000000.bin
val_bin=$data/shards/fortunes_val_000000.bin

# (c) Training. The same run for every config (seed, data order, schedule) but the format
# flags, and the seed of fp32_seed2. lr 3e-3 is high enough that a lossy state format would
# show; the final validation (all of the val split) is `eval` on the last checkpoint.
common=(--device host --data "$train_bin" --val-data "$val_bin" -b 8 --seq-len 128
  --steps "$steps" --lr 3e-3 --warmup 100 --lr-decay cosine --min-lr-fraction 0.1
  --weight-decay 0.1 --grad-clip 1.0 --beta1 0.9 --beta2 0.95
  --eval-every "$eval_every" --eval-batches 16 --log-every 500 --checkpoint-every 0 --keep 1)

# A config runs only if this binary accepts its flags (--master-weights is newer than
# --optimizer-state): one step of the tiny model on synthetic data tells.
probe() {
  # shellcheck disable=SC2046  # flags_of's words are separate flags
  "$bin" train --device host --model tiny --data synthetic --steps 1 -q $(flags_of "$1") \
    > "$out/probe.log" 2>&1
}
ran=()
for c in $configs; do
  if probe "$c"; then
    ran+=("$c")
  else
    echo "skip $c: this offload_train rejects '$(flags_of "$c")':" \
      "$(grep -m1 'error' "$out/probe.log" || tail -1 "$out/probe.log")"
  fi
done
[ ${#ran[@]} -gt 0 ] || die "no config can run"

failed=0
printf 'model,config,final_val_loss,vs_fp32_pct,within_1pct,last_eval_val_loss,train_s\n' > "$out/summary.csv"
for m in $models; do
  for c in "${ran[@]}"; do
    run=$out/$m/$c
    rm -rf "$run" && mkdir -p "$run"
    echo "== $m $c: $(flags_of "$c")"
    t0=$SECONDS
    # shellcheck disable=SC2046  # flags_of's words are separate flags
    if ! "$bin" train --model "$(spec_of "$m")" "${common[@]}" $(flags_of "$c") \
      --metrics "$run/metrics.jsonl" --checkpoint-dir "$run/ckpt" > "$run/train.log" 2>&1; then
      echo "FAILED: $m $c (see $run/train.log):"; tail -3 "$run/train.log"
      failed=1
      continue
    fi
    echo "$((SECONDS - t0))" > "$run/seconds"
    grep '^done:' "$run/train.log" || true
    "$bin" eval --device host --checkpoint latest --checkpoint-dir "$run/ckpt" --data "$val_bin" \
      --val-fraction 1 -b 8 --seq-len 128 --json > "$run/eval.json"
  done

  # (d) The CSVs: every step (train loss, val loss where evaluated) and, small enough to commit,
  # the eval steps only with the train loss averaged since the previous evaluation.
  have=()
  for c in "${ran[@]}"; do [ -f "$out/$m/$c/eval.json" ] && have+=("$c"); done
  [ ${#have[@]} -gt 0 ] || continue
  metrics=()
  for c in "${have[@]}"; do metrics+=("$out/$m/$c/metrics.jsonl"); done
  awk -v cfgs="${have[*]}" -v every="$eval_every" -v steps_csv="$out/${m}_steps.csv" \
    -v eval_csv="$results/$m.csv" '
    function num(s, key) {  # the value of "key": in one JSON object line (keys are unique)
      if (!match(s, "\"" key "\":[^,}]*")) return ""
      return substr(s, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    }
    BEGIN { nc = split(cfgs, cfg, " ") }
    FNR == 1 { c++ }
    {
      s = num($0, "step") + 0; train[c, s] = num($0, "loss"); val[c, s] = num($0, "val_loss")
      if (s > last) last = s
    }
    END {
      header = "step"
      for (c = 1; c <= nc; c++) header = header "," cfg[c] "_train," cfg[c] "_val"
      print header > steps_csv; print header > eval_csv
      for (s = 1; s <= last; s++) {
        row = s; erow = s; evaluated = 0
        for (c = 1; c <= nc; c++) {
          sum[c] += train[c, s]; cnt[c]++
          row = row "," train[c, s] "," val[c, s]
          v = (val[c, s] == "") ? "" : sprintf("%.5f", val[c, s])
          erow = erow "," sprintf("%.5f", sum[c] / cnt[c]) "," v
          if (val[c, s] != "") evaluated = 1
        }
        print row > steps_csv
        if (evaluated) { print erow > eval_csv; for (c = 1; c <= nc; c++) { sum[c] = 0; cnt[c] = 0 } }
      }
    }' "${metrics[@]}"

  # The summary: the final validation loss over the whole val split, against fp32's.
  base=""
  [ -f "$out/$m/fp32/eval.json" ] && base=$(grep -o '"loss":[^,}]*' "$out/$m/fp32/eval.json" | cut -d: -f2)
  for c in "${have[@]}"; do
    v=$(grep -o '"loss":[^,}]*' "$out/$m/$c/eval.json" | cut -d: -f2)
    last_val=$(grep -o '"val_loss":[^,}]*' "$out/$m/$c/metrics.jsonl" | tail -1 | cut -d: -f2)
    t=$(cat "$out/$m/$c/seconds")
    awk -v m="$m" -v c="$c" -v v="$v" -v b="$base" -v lv="$last_val" -v t="$t" 'BEGIN {
      d = (b == "") ? "" : sprintf("%+.3f", 100 * (v - b) / b)
      ok = (d + 0 <= 1 && d + 0 >= -1) ? "PASS" : "FAIL"
      if (c == "fp32_seed2") ok = "(seed ref)"  # a yardstick, not a format under test
      if (d == "") ok = "n/a"
      printf "%s,%s,%.5f,%s,%s,%.5f,%d\n", m, c, v, d, ok, lv, t }' >> "$out/summary.csv"
  done

  # (e) The plot, from the committed CSV.
  gnuplot -c "$here/plot.gp" "$results/$m.csv" "$images/convergence_$m.svg" \
    "$m ($(basename "$(spec_of "$m")")), $steps steps: optimizer formats on fortunes (bytes)" \
    "${have[*]}"
  echo "plot: $images/convergence_$m.svg"
done

cp "$out/summary.csv" "$results/summary.csv"
# The table, as markdown, for the docs and the terminal.
{
  echo "| model | config | final val loss | vs fp32 | within 1% | last periodic val loss | train s |"
  echo "|---|---|---:|---:|---|---:|---:|"
  tail -n +2 "$out/summary.csv" | awk -F, '{ printf "| %s | %s | %s | %s%s | %s | %s | %s |\n",
    $1, $2, $3, $4, ($4 == "" ? "" : "%"), $5, $6, $7 }'
} | tee "$results/summary.md"
if grep -q ',FAIL,' "$out/summary.csv"; then
  echo "run.sh: a config is not within 1% of fp32"
  failed=1
fi
echo "run.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s in all"
exit "$failed"
