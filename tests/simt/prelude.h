// Force-included (-include) into gpu/src/*.cu compiled as C++ for the SIMT emulator
// (tests/simt/simt.h): the CUDA headers first, then the device-side vocabulary the kernels use,
// mapped onto the emulator. Only what gpu/ uses is here; a kernel using something else fails to
// compile in the emulated build, which is the signal to add it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "simt.h"
#include "streams.h"
#include "warp_matrix.h"

#define ZO_SIMT_EMULATION 1

// Shared memory: one copy per OS thread, and a block's fibers all run on one OS thread.
#undef __shared__
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define ZO_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::zo::simt::dynamic_shared())

#define threadIdx (::zo::simt::thread_idx())
#define blockIdx (::zo::simt::block_idx())
#define blockDim (::zo::simt::block_dim())
#define gridDim (::zo::simt::grid_dim())
#define warpSize 32

inline void __syncthreads(const std::source_location& where = std::source_location::current()) {
  ::zo::simt::syncthreads(where);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  const std::source_location& where = std::source_location::current()) {
  return ::zo::simt::shfl_xor(mask, v, lane_mask, width, where);
}

// Round-to-nearest intrinsics: the host's IEEE operations (the emulated build compiles with
// -ffp-contract=off, so no FMA is formed where the kernel does not ask for one).
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline float __int_as_float(int i) {
  return std::bit_cast<float>(i);
}
inline int __float_as_int(float f) {
  return std::bit_cast<int>(f);
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
using std::isfinite;

// CUDA's integer and floating min/max overloads (device code calls them unqualified).
#define ZO_SIMT_MINMAX(T)  \
  inline T min(T a, T b) { \
    return b < a ? b : a;  \
  }                        \
  inline T max(T a, T b) { \
    return a < b ? b : a;  \
  }
ZO_SIMT_MINMAX(int)
ZO_SIMT_MINMAX(unsigned)
ZO_SIMT_MINMAX(long long)
ZO_SIMT_MINMAX(unsigned long long)
ZO_SIMT_MINMAX(long)
ZO_SIMT_MINMAX(unsigned long)
#undef ZO_SIMT_MINMAX
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}

// cuda_runtime.h's typed overload exists only for nvcc.
template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// kernel<<<grid, block, smem, stream>>>(args...) as spelled by gpu/src (ZO_LAUNCH, launch_util.h).
namespace zo::simt {
template <typename P, typename A>
void add_use(std::vector<Use>& uses, const A& arg) {
  if constexpr (std::is_pointer_v<P>) uses.push_back({static_cast<const void*>(P(arg)), 1});
}

template <typename... Params>
class KernelLaunch {
 public:
  KernelLaunch(dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
               void (*kernel)(Params...), const char* name)
      : grid_(grid), block_(block), smem_(smem), stream_(stream), kernel_(kernel), name_(name) {}
  template <typename... Args>
  void operator()(Args&&... args) const {
    // Arguments are copied per launch, as CUDA copies them into the parameter buffer; the
    // configuration is checked now, the kernel runs later in its stream's order.
    const void* id = reinterpret_cast<const void*>(kernel_);
    check_launch(grid_, block_, smem_, id, name_);
    auto body = [kernel = kernel_, ... a = static_cast<Params>(args)] { kernel(a...); };
    std::vector<Use> uses;  // where the pointer arguments point (check_released)
    (add_use<Params>(uses, args), ...);
    enqueue(
        stream_,
        [grid = grid_, block = block_, smem = smem_, id, name = name_, body] {
          launch(grid, block, smem, id, name, body);
        },
        std::move(uses), name_);
  }

 private:
  dim3 grid_, block_;
  std::size_t smem_;
  cudaStream_t stream_;
  void (*kernel_)(Params...);
  const char* name_;
};
template <typename... Params>
KernelLaunch(dim3, dim3, std::size_t, cudaStream_t, void (*)(Params...), const char*)
    -> KernelLaunch<Params...>;
}  // namespace zo::simt

#define ZO_LAUNCH(grid, block, smem, stream, ...) \
  ::zo::simt::KernelLaunch(grid, block, smem, stream, __VA_ARGS__, #__VA_ARGS__)
