// Device-side conversions between the storage types, private to gpu/src: kernels include this to
// load 16-bit storage as fp32 and store fp32 results back with the same rounding, and to move
// elements in aligned packs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

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

// kVec elements of T at p (aligned to the pack) widened to fp32, and stored back rounded.
template <typename T, int kVec>
__device__ __forceinline__ void load_floats(const T* p, float (&x)[kVec]) {
  const Pack<T, kVec> v = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    x[k] = to_float(v.v[k]);
}

template <typename T, int kVec>
__device__ __forceinline__ void store_floats(T* p, const float (&x)[kVec]) {
  Pack<T, kVec> v;
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    v.v[k] = from_float<T>(x[k]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = v;
}

}  // namespace zo::gpu
