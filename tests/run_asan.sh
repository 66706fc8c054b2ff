#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer job (docs/testing.md, "ASan + UBSan job"): builds
# the host code with clang and -fsanitize=address,undefined (and LeakSanitizer, part of ASan) in
# the build the fuzzing job uses too (tests/asan_build.sh) and runs, through ctest, the suites that
# parse input and run the trainer.
# Exits non-zero on any sanitizer report (memory error, leak, undefined behaviour: UBSan does not
# recover, see CMakeLists.txt), on any test failure and on a test that runs past its time limit.
#   ASAN_BUILD_DIR   build directory (default: build-asan)
#   ASAN_JOBS        parallel compile and test jobs (default: nproc)
#   ASAN_TESTS       suites to build and run, space-separated (default: the eleven below)
#   ASAN_CTEST_ARGS  extra ctest arguments, e.g. "-R Trainer" or "-E LearnsTheSyntheticTask"
#   ASAN_TIMEOUT     seconds each test may run (default: 1800)
#   ASAN_INPUTS      1 (default): then tests/run_asan_inputs.sh, the hostile inputs; 0: not
#   ASAN_OPTIONS, UBSAN_OPTIONS, LSAN_OPTIONS  appended to the ones set here
# Not run: the MPI suites (test_comm under mpiexec, test_data_parallel): OpenMPI's own libraries
# are not instrumented and leak at MPI_Init/MPI_Finalize, so LeakSanitizer would need broad
# suppressions of system libraries; MPI is left out of this build instead (the collectives'
# logic runs here through test_offload's in-process communicator).
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/known_targets.sh
source tests/asan_build.sh
bash .ci/install-deps

build_dir=${ASAN_BUILD_DIR:-build-asan}
jobs=${ASAN_JOBS:-$(nproc)}
read -r -a suites <<<"${ASAN_TESTS:-test_core test_checkpoint test_data test_model test_train \
test_cli test_reliability test_offload test_host_device test_resident_updater test_state_io}"
limit=${ASAN_TIMEOUT:-1800}

start=$SECONDS
asan_build_configure "$build_dir"

found=$(known_targets run_asan "$build_dir" "${suites[@]}")
read -r -a targets <<<"$found"
# test_cli and test_reliability depend on offload_train: the binary they run is instrumented too.
# The hostile inputs (run_asan_inputs.sh, below) go through it and reseal_checkpoint.
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" offload_train reseal_checkpoint
echo "run_asan: configure + build took $((SECONDS - start)) s"

# detect_leaks: LeakSanitizer at every test's exit (the default on x86-64 Linux; stated here).
# check_initialization_order: static initialisers that read another file's uninitialised globals.
# Suppressions of leaks in system libraries: tests/lsan.supp, one reason per entry.
export ASAN_OPTIONS="detect_leaks=1 check_initialization_order=1 strict_init_order=1${ASAN_OPTIONS:+ $ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1${UBSAN_OPTIONS:+ $UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp print_suppressions=0${LSAN_OPTIONS:+ $LSAN_OPTIONS}"

# The suites' tests by their ctest label (one label per suite, tests/CMakeLists.txt).
labels=$(IFS='|'; echo "${targets[*]}")
start=$SECONDS
rc=0
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" -L "^(${labels})\$" -j "$jobs" --timeout "$limit" \
  --output-on-failure ${ASAN_CTEST_ARGS:-} || rc=$?
echo "run_asan: tests took $((SECONDS - start)) s"
# The fuzz seeds, regression inputs and damaged checkpoints through the binary's commands.
if [[ ${ASAN_INPUTS:-1} == 1 ]]; then
  bash tests/run_asan_inputs.sh "$build_dir" || rc=1
fi
if [[ $rc -ne 0 ]]; then
  echo "run_asan: FAILED (a sanitizer report, a failing test or a hostile input above)" >&2
  exit 1
fi
echo "run_asan: clean: ${targets[*]} and the hostile inputs"
