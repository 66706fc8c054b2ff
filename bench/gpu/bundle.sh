#!/usr/bin/env bash
# Builds the relocatable GPU bundle on a machine without a GPU (docs/gpu.md): offload_train, the
# GPU test binaries and the GPU benchmarks for sm_90 only (Release, stripped), with the non-CUDA
# shared libraries they need copied beside them. The CUDA libraries (cudart is static; cuBLASLt,
# NCCL, the driver) come from the device machine: env.sh finds them there.
#   bash bench/gpu/bundle.sh [BUNDLE_DIR]      (default gpu-bundle/, ignored by git)
#   ZO_BUNDLE_REF=here|DIR: the check phase's host reference, made here or copied from DIR (below)
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/../.."
root=$PWD
bundle=${1:-gpu-bundle}
build=${ZO_BUNDLE_BUILD:-build-bundle}
max_mib=40
targets=(offload_train test_gpu test_cuda_ops test_pinned_memory bench_copy bench_train
  bench_cpu_adam bench_state_dir)

bash .ci/install-deps
mkdir -p "$build"
[ -x /usr/local/cuda/bin/nvcc ] || { echo "bundle: needs the CUDA toolkit in /usr/local/cuda" >&2; exit 1; }
# MPI is left out: one GPU per machine, and the device machine has no OpenMPI to load.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DZO_BUILD_BENCH=ON \
  -DZO_BUILD_TESTS=ON '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' '-DCMAKE_CUDA_FLAGS=--compress-mode=size' \
  > "$build/configure.log"
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for t in "${targets[@]}"; do
  f=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  [ -n "$f" ] || { echo "bundle: $t was not built" >&2; exit 1; }
  cp "$f" "$bundle/bin/"
  strip "$bundle/bin/$t"
done
cp bench/gpu/run.sh bench/gpu/env.sh bench/gpu/check_step.sh bench/gpu/summarize.py bench/gpu/targets.py bench/gpu/kernel_profile.py bench/pytorch_gpt2.py bench/pytorch_llama.py \
  bench/pytorch_timing.py "$bundle/"
git -C "$root" rev-parse --short HEAD > "$bundle/COMMIT" 2>/dev/null || echo unknown > "$bundle/COMMIT"
git -C "$root" diff --quiet 2>/dev/null || echo "(with uncommitted changes)" >> "$bundle/COMMIT"

# A CUDA library, libc's family or libstdc++/libgcc comes from the device machine; anything else
# that ldd resolves is copied into lib/.
system_lib='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcublasLt|libnccl)'
for pass in 1 2; do  # twice: copied libraries may need further ones
  for f in "$bundle"/bin/* "$bundle"/lib/*; do
    LD_LIBRARY_PATH="$bundle/lib" ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
      while read -r name path; do
        [[ $name =~ $system_lib ]] && continue
        [ -e "$bundle/lib/$name" ] || cp -L "$path" "$bundle/lib/$name"
      done
  done
done

# The check: nothing resolves from outside the bundle except the system and CUDA libraries.
bad=0
for f in "$bundle"/bin/* "$bundle"/lib/*; do
  while read -r name path; do
    [[ $name =~ $system_lib ]] && continue
    if [[ $path != "$(realpath "$bundle")/lib/"* ]]; then
      echo "bundle: $(basename "$f") resolves $name from $path, outside the bundle" >&2
      bad=1
    fi
  done < <(LD_LIBRARY_PATH="$(realpath "$bundle")/lib" ldd "$f" |
           awk '$2 == "=>" {print $1, ($3 ~ /^\// ? $3 : "not-found")}')
done
[ "$bad" = 0 ] || exit 1

# The check phase's host-backend step, by this commit's offload_train (docs/gpu.md): made here
# by the bundle's own binary (ZO_BUNDLE_REF=here, 10-15 min on 2 cores), or copied from DIR.
ref=(check_124m_host_fp32.metrics check_124m_host_fp32.log)
if [ "${ZO_BUNDLE_REF:-}" = here ]; then
  mkdir -p "$bundle/ref"
  . bench/gpu/check_step.sh
  echo "bundle: the host backend's check step, into $bundle/ref"
  if ! (. "$bundle/env.sh" && "$bundle/bin/offload_train" train --data synthetic --eval-batches 1 \
          --log-every 5 --metrics "$bundle/ref/${ref[0]}" "${check_step[@]}" --device host \
          --precision fp32) > "$bundle/ref/${ref[1]}" 2>&1; then
    echo "bundle: the host reference step failed: $bundle/ref/${ref[1]}" >&2
    exit 1
  fi
elif [ -n "${ZO_BUNDLE_REF:-}" ]; then
  mkdir -p "$bundle/ref"
  cp "${ref[@]/#/$ZO_BUNDLE_REF/}" "$bundle/ref/"
fi
size_mib=$(( $(du -sk "$bundle" | cut -f1) / 1024 ))
if [ "$size_mib" -gt "$max_mib" ]; then
  echo "bundle: $bundle is $size_mib MiB, over the $max_mib MiB limit" >&2
  exit 1
fi
echo "bundle: $bundle ($size_mib MiB, commit $(head -1 "$bundle/COMMIT")); ldd check passed"
ls -l "$bundle/bin" "$bundle/lib"
