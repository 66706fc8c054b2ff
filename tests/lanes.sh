# Sourced by the sanitizer and fuzz jobs: runs independent jobs side by side, one per lane.
#   run_in_lanes N FUNC ITEM...  calls `FUNC ITEM LANE` for every ITEM in order, at most N at
#   once; LANE (0 to N-1) is free for that call alone, so FUNC may pin it to the LANE-th CPU.
#   Each call's output is printed whole when it ends, not interleaved with the others'. The items
#   whose call failed are left in LANES_FAILED, in the order they ended; returns 0.
# Longest items first keeps the lanes evenly loaded.

run_in_lanes() {
  local lanes=$1 fn=$2
  shift 2
  [[ $lanes -ge 1 ]] || lanes=1
  LANES_FAILED=()
  local logs
  logs=$(mktemp -d)
  local -a free=()
  local -A lane_of=() item_of=()
  local lane item
  for ((lane = 0; lane < lanes; lane++)); do free+=("$lane"); done
  for item in "$@"; do
    [[ ${#free[@]} -gt 0 ]] || _lanes_reap "$logs"
    lane=${free[0]}
    free=("${free[@]:1}")
    "$fn" "$item" "$lane" >"$logs/$lane" 2>&1 &
    lane_of[$!]=$lane
    item_of[$!]=$item
  done
  while [[ ${#lane_of[@]} -gt 0 ]]; do _lanes_reap "$logs"; done
  rm -rf "$logs"
}

# Waits for one call of run_in_lanes to end: prints its output, frees its lane.
_lanes_reap() {
  local logs=$1 pid rc=0
  wait -n -p pid "${!lane_of[@]}" || rc=$?
  cat "$logs/${lane_of[$pid]}"
  [[ $rc -eq 0 ]] || LANES_FAILED+=("${item_of[$pid]}")
  free+=("${lane_of[$pid]}")
  unset "lane_of[$pid]" "item_of[$pid]"
}

# The CPUs this process may run on, one per line (Cpus_allowed_list: "0-3,8,10-11").
allowed_cpus() {
  local range
  local -a ranges
  IFS=, read -r -a ranges < <(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
  for range in "${ranges[@]}"; do
    seq "${range%-*}" "${range#*-}"
  done
}
