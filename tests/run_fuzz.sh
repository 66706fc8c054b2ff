#!/usr/bin/env bash
# Fuzzing job (docs/testing.md, "Fuzzing"): builds the libFuzzer targets of tests/fuzz/ with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer in the ASan job's build (tests/asan_build.sh:
# after that job, only the targets' own files compile) and runs each for a
# bounded time from a copy of its seed corpus (tests/fuzz/corpus/<target>/). Exits non-zero if a
# target crashes: a sanitizer report, an exception that is not a std::exception, an input that
# runs past FUZZ_TIMEOUT, or more memory than FUZZ_RSS_MB; the reproducer's path is printed.
#   FUZZ_BUILD_DIR  build directory (default: build-asan, the ASan job's)
#   FUZZ_JOBS       parallel compile jobs (default: nproc)
#   FUZZ_TARGETS    targets to run, space-separated (default: every tests/fuzz/corpus/<target>)
#   FUZZ_SECONDS    seconds of fuzzing per target (default: 20; 0 runs the seeds only)
#   FUZZ_LANES      targets fuzzed at once, one process each (default: nproc)
#   FUZZ_TIMEOUT    seconds one input may take (default: 10)
#   FUZZ_RSS_MB     memory limit of a target in MiB, also its largest allocation (default: 2048)
#   FUZZ_OUT        working corpora, logs and reproducers (default: <build dir>/fuzz-out)
#   FUZZ_ARGS       extra libFuzzer flags, e.g. "-max_len=65536" or "-fork=2 -ignore_crashes=1"
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/lanes.sh
source tests/asan_build.sh

build_dir=${FUZZ_BUILD_DIR:-build-asan}
jobs=${FUZZ_JOBS:-$(nproc)}
seconds=${FUZZ_SECONDS:-20}
out=${FUZZ_OUT:-$build_dir/fuzz-out}
if [[ -n ${FUZZ_TARGETS:-} ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for d in tests/fuzz/corpus/*/; do
    targets+=("$(basename "$d")")
  done
fi

start=$SECONDS
asan_build_configure "$build_dir"
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]/#/fuzz_}"
echo "run_fuzz: configure + build took $((SECONDS - start)) s"

# Leaks count as crashes too (libFuzzer checks after inputs that allocate more than they free).
export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+ $ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1${UBSAN_OPTIONS:+ $UBSAN_OPTIONS}"

# One target; the targets run side by side, FUZZ_LANES at once.
fuzz_target() {
  local t=$1 work=$out/$1 start=$SECONDS rc=0 runs f report
  rm -rf "$work"
  mkdir -p "$work/crashes"
  cp -r "tests/fuzz/corpus/$t" "$work/corpus"
  local args=(-timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}"
              -artifact_prefix="$work/crashes/" -print_final_stats=1)
  if [[ $t != shard ]]; then
    args+=(-dict=tests/fuzz/json.dict)
  fi
  if [[ $seconds -gt 0 ]]; then
    args+=(-max_total_time="$seconds")
  else
    args+=(-runs=0)
  fi
  # shellcheck disable=SC2206
  args+=(${FUZZ_ARGS:-})
  "$build_dir/tests/fuzz/fuzz_$t" "${args[@]}" "$work/corpus" >"$work/log" 2>&1 || rc=$?
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log")
  if [[ $rc -eq 0 ]]; then
    echo "=== fuzz_$t: clean, ${runs:-?} inputs in $((SECONDS - start)) s" \
      "(corpus $(find "$work/corpus" -type f | wc -l) files)"
    return 0
  fi
  echo "=== fuzz_$t: CRASHED (exit code $rc, $((SECONDS - start)) s); its report:"
  # From the report's first line (else the log's end), without libFuzzer's progress lines.
  report='ERROR: |runtime error:|ALARM:|out-of-memory|deadly signal'
  if grep -qE "$report" "$work/log"; then
    awk -v re="$report" '(shown || $0 ~ re) && shown++ < 150' "$work/log"
  else
    tail -n 60 "$work/log"
  fi
  for f in "$work/crashes"/*; do
    [[ -e $f ]] || continue
    echo "=== fuzz_$t: reproducer $f (run: $build_dir/tests/fuzz/fuzz_$t $f)"
    # CI keeps only the log: small reproducers go into it (base64 -d > file).
    if [[ $(stat -c %s "$f") -le 4096 ]]; then
      echo "=== base64: $(base64 -w0 "$f")"
    fi
  done
  return 1
}
run_in_lanes "${FUZZ_LANES:-$(nproc)}" fuzz_target "${targets[@]}"
if [[ ${#LANES_FAILED[@]} -gt 0 ]]; then
  echo "run_fuzz: FAILED: ${LANES_FAILED[*]}" >&2
  exit 1
fi
echo "run_fuzz: clean: ${targets[*]}"
