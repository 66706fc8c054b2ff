# Sourced by run.sh (or by hand: `. gpu-bundle/env.sh`): puts the bundle's lib/ and the device
# machine's CUDA libraries on LD_LIBRARY_PATH. cuBLASLt and NCCL are looked for in the CUDA
# toolkit's lib64 first, then in the nvidia/*/lib folders of an installed PyTorch; prints which.
zo_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
zo_cuda_dirs=()
zo_have() {  # zo_have LIB DIR...: the first DIR holding LIB
  local lib=$1 d; shift
  for d in "$@"; do
    if compgen -G "$d/$lib*" > /dev/null; then echo "$d"; return 0; fi
  done
  return 1
}
zo_candidates=()
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/lib/x86_64-linux-gnu; do
  [ -d "$d" ] && zo_candidates+=("$d")
done
zo_py_nvidia=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -n "$zo_py_nvidia" ]; then
  for d in "$zo_py_nvidia"/nvidia/*/lib "$zo_py_nvidia"/nvidia/*/lib64; do
    [ -d "$d" ] && zo_candidates+=("$d")
  done
fi
for lib in libcublasLt.so.13 libnccl.so.2; do
  if d=$(zo_have "$lib" "${zo_candidates[@]}"); then
    echo "env.sh: $lib from $d"
    [[ " ${zo_cuda_dirs[*]} " == *" $d "* ]] || zo_cuda_dirs+=("$d")
  elif d=$(dirname "$(timeout 30 find /usr /opt -name "$lib" -print -quit 2>/dev/null)") && [ "$d" != . ]; then
    echo "env.sh: $lib from $d (found by searching /usr and /opt)"
    zo_cuda_dirs+=("$d")
  else
    echo "env.sh: $lib not found (looked in ${zo_candidates[*]}, /usr, /opt)" >&2
  fi
done
zo_joined=$(IFS=:; echo "${zo_cuda_dirs[*]}")
export LD_LIBRARY_PATH="$zo_bundle/lib${zo_joined:+:$zo_joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$zo_bundle/bin:$PATH"
unset zo_cuda_dirs zo_candidates zo_py_nvidia zo_joined
