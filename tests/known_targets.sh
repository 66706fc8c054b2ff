# Sourced by the sanitizer jobs (run_tsan.sh, run_asan.sh).
# known_targets JOB BUILD_DIR SUITE...: prints, on one line, the suites that are targets in this
# tree (tests/CMakeLists.txt adds a module's suite once its source exists) and names the others
# it skips; fails if none is. Works for the Makefile and Ninja generators.
known_targets() {
  local job=$1 build_dir=$2 known t
  local -a found=()
  shift 2
  known=$(cmake --build "$build_dir" --target help)
  for t in "$@"; do
    if grep -qE "(^|[ .])${t}(:|[[:space:]]|$)" <<<"$known"; then
      found+=("$t")
    else
      echo "$job: no target $t in this tree; skipping it" >&2
    fi
  done
  if [[ ${#found[@]} -eq 0 ]]; then
    echo "$job: none of $* is a target here; nothing to run" >&2
    return 1
  fi
  echo "${found[*]}"
}
