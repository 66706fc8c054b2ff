# Sourced by the ASan + UBSan job and the fuzzing job (tests/run_asan.sh, tests/run_fuzz.sh): both
# use one build, so the libraries are compiled once for the two (most of either job's time).
# clang 14 (libFuzzer), -fsanitize=address,undefined, and every library compiled with libFuzzer's
# coverage (-fsanitize=fuzzer-no-link; only the fuzz targets link libFuzzer's main). -O1 (ASan's
# advice) builds faster than -O2; -g1: line tables, all a report's stack needs. Assertions stay on,
# libstdc++'s too: misuse such as nlohmann::json's const operator[] with a missing key then stops
# at once instead of reading memory ASan may not watch. No CUDA, benchmarks or MPI (OpenMPI's own
# libraries are not instrumented and leak at MPI_Init/MPI_Finalize).
#   asan_build_configure BUILD_DIR: installs clang if missing and configures BUILD_DIR.
asan_build_configure() {
  # llvm-14 brings llvm-symbolizer, for stack traces with file:line.
  bash .ci/install-deps clang-14 libclang-rt-14-dev llvm-14
  cmake -S . -B "$1" -DCMAKE_CXX_COMPILER=clang++-14 -DZO_FUZZ=ON \
    -DZO_SANITIZE=address,undefined -DZO_CUDA=OFF -DZO_BUILD_BENCH=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -D_GLIBCXX_ASSERTIONS"
  if [[ -x /usr/lib/llvm-14/bin/llvm-symbolizer ]]; then
    export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
  fi
}
