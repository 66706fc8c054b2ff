// SwiGLU (arXiv 2002.05202), Llama's MLP activation: out (N, I) = silu(gate) * up with
// silu(x) = x sigmoid(x), from gate_up (N, 2I) whose rows are [gate (I) | up (I)] (one matmul
// with the gate and up projections stacked); the backward writes dgate_up (N, 2I) =
// [dout * up * silu'(gate) | dout * silu(gate)], silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
// Formulas as the host reference (src/device/host_ops_llama.cpp).
//
// One thread per (row, j < I), grid-stride: it reads gate and up at (n, j), (n, I + j) and
// writes out (n, j), or both gradient elements, so dgate_up may alias gate_up. fp32 arithmetic;
// expf, not __expf, to stay within the host's tolerance. Memory-bound and scalar.

#include <cstddef>
#include <cstdint>
#include <string>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kSwigluThreads = 256;

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// kBackward: dgate_up written from dout; otherwise out written.
template <typename T, bool kBackward>
__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_kernel(T* dst, const T* gate_up, const T* __restrict__ dout, std::int64_t n, int I) {
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / I;
    const std::int64_t gi = e + row * I, ui = gi + I;  // (row, j) and (row, I + j) of (N, 2I)
    const float gate = to_float(gate_up[gi]), up = to_float(gate_up[ui]), s = sigmoid(gate);
    if constexpr (kBackward) {
      const float d = to_float(dout[e]);
      dst[gi] = from_float<T>(d * up * (s * (1.0f + gate * (1.0f - s))));
      dst[ui] = from_float<T>(d * gate * s);
    } else {
      dst[e] = from_float<T>(gate * s * up);
    }
  }
}

namespace {

template <bool kBackward>
void launch_swiglu(const char* op, void* dst, const void* gate_up, const void* dout, int N, int I,
                   DType t, cudaStream_t s) {
  detail::check_dtype(op, t);
  const std::string shape = "N = " + std::to_string(N) + ", I = " + std::to_string(I);
  if (!detail::check_rows(op, N, I, "I", "a row needs a gate and an up half", shape)) return;
  detail::check_not_null(op, {{dst, kBackward ? "dgate_up" : "out"}, {gate_up, "gate_up"}},
                         [&] { return shape; });
  if (kBackward) detail::check_not_null(op, {{dout, "dout"}}, [&] { return shape; });
  const std::int64_t n = std::int64_t{N} * I;
  ZO_DISPATCH_DTYPE(t, T, {
    ZO_LAUNCH(detail::fill_grid(static_cast<std::size_t>(n), kSwigluThreads), kSwigluThreads, 0, s,
              swiglu_kernel<T, kBackward>)
    (static_cast<T*>(dst), static_cast<const T*>(gate_up), static_cast<const T*>(dout), n, I);
  });
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_swiglu_forward(void* out, const void* gate_up, int N, int I, DType t, cudaStream_t s) {
  launch_swiglu<false>("launch_swiglu_forward", out, gate_up, nullptr, N, I, t, s);
}

void launch_swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, int N, int I,
                            DType t, cudaStream_t s) {
  launch_swiglu<true>("launch_swiglu_backward", dgate_up, gate_up, dout, N, I, t, s);
}

}  // namespace zo::gpu
