// Device-side conversions between the storage types and the cast kernel. Other kernels include
// this to load 16-bit storage as fp32 and store fp32 results back with the same rounding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>

#include "gpu/cast.h"

namespace zo::gpu {

// Widening to fp32 is exact for every storage type.
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "storage type must be float, half or bf16");
    return __bfloat162float(x);
  }
}

// Narrowing from fp32 rounds to nearest, ties to even (the host converters do the same).
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "storage type must be float, half or bf16");
    return __float2bfloat16_rn(x);
  }
}

// N elements moved as one aligned load/store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Grid-stride over whole packs of kVec elements, then one thread per element of the tail
// (fewer than kVec). kVec == 1 is the path for pointers not aligned to a pack.
template <typename Src, typename Dst, int kVec>
__global__ void cast_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, std::size_t n) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  const auto* src_packs = reinterpret_cast<const Pack<Src, kVec>*>(src);
  auto* dst_packs = reinterpret_cast<Pack<Dst, kVec>*>(dst);
  for (std::size_t p = tid; p < packs; p += stride) {
    const Pack<Src, kVec> in = src_packs[p];
    Pack<Dst, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      out.v[k] = from_float<Dst>(to_float(in.v[k]));
    dst_packs[p] = out;
  }
  const std::size_t i = packs * kVec + tid;
  if (i < n) dst[i] = from_float<Dst>(to_float(src[i]));
}

}  // namespace zo::gpu
