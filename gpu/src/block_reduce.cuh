// Warp and block sums for kernels, private to gpu/src: fixed shuffle trees, so every lane gets
// the same bits on every run (layernorm and the sum of squares rely on this).
#pragma once

namespace zo::gpu {

// Sum over the 32 lanes by an xor butterfly. Every lane ends with the same bits: at each step the
// two partners add the same two values, and IEEE addition is commutative.
template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 (at most
// 1024), every thread must call it, and `shared` must hold 32 values. Safe to call repeatedly
// with the same `shared` (it synchronises before reusing it).
template <typename Acc>
__device__ __forceinline__ Acc block_sum(Acc v, Acc* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  Acc total = lane < warps ? shared[lane] : Acc(0);
  total = warp_sum(total);  // every warp reduces the same values in the same order
  return total;
}

}  // namespace zo::gpu
