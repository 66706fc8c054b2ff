// Elementwise ops of the GPT block: GELU forward and backward, the residual add and gradient
// accumulation, and the GELU gradient applied in place (the fallback of the matmul's DGELU
// epilogue, matmul_bias.h). One kernel template, elementwise_kernel<T, kVec, Op>, computes
//     dst[i] = Op::apply(dst[i] (if Op::kReadsDst), a[i], b[i] (if Op::kUsesB))
// in fp32 with T loads and stores.
//
// Launch shape: 1-D, kElementwiseThreads threads per block, grid-stride over whole packs of kVec
// elements (16 B: 4 floats or 8 halves), grid = min(packs / threads, one full GPU); then one
// thread per element of the tail (fewer than kVec). kVec == 1 is the path for pointers that are
// not all 16-byte aligned. Memory-bound: one 16 B access per operand per pack.
//
// Each thread reads all of its inputs before it writes its outputs, and every element is owned
// by one thread, so dst may alias a or b (e.g. residual_forward(x, x, y)).

#include <cstddef>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"
#include "matmul_bias.h"

namespace zo::gpu {

constexpr int kElementwiseThreads = 256;

// GELU, tanh approximation (arXiv 1606.08415), formulas exactly as the host reference
// (src/device/host_ops_matmul_elementwise.cpp).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluForwardOp {
  static constexpr bool kReadsDst = false;
  static constexpr bool kUsesB = false;
  __device__ __forceinline__ static float apply(float, float x, float) {
    return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCube * x * x * x)));
  }
};

// gelu'(x), with sech^2 = 1 / cosh^2 as the host (precise where tanh -> +-1; cosh overflows to
// inf for |u| > ~89, giving the correct limit 0).
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float th = tanhf(u);
  const float ch = coshf(u);
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f / (ch * ch)) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
}

// dinp += gelu'(x) * dout
struct GeluBackwardOp {
  static constexpr bool kReadsDst = true;
  static constexpr bool kUsesB = true;
  __device__ __forceinline__ static float apply(float dinp, float x, float dout) {
    return dinp + gelu_grad(x) * dout;
  }
};

// d = gelu'(x) * d, in place
struct GeluGradScaleOp {
  static constexpr bool kReadsDst = true;
  static constexpr bool kUsesB = false;
  __device__ __forceinline__ static float apply(float d, float x, float) {
    return gelu_grad(x) * d;
  }
};

// out = a + b
struct AddOp {
  static constexpr bool kReadsDst = false;
  static constexpr bool kUsesB = true;
  __device__ __forceinline__ static float apply(float, float a, float b) { return a + b; }
};

// dst += a
struct AccumulateOp {
  static constexpr bool kReadsDst = true;
  static constexpr bool kUsesB = false;
  __device__ __forceinline__ static float apply(float dst, float a, float) { return dst + a; }
};

// No __restrict__: dst may alias a or b (see above). b is unused (may be null) unless Op::kUsesB.
template <typename T, int kVec, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    elementwise_kernel(T* dst, const T* a, const T* b, std::size_t n) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  auto* dst_packs = reinterpret_cast<Pack<T, kVec>*>(dst);
  const auto* a_packs = reinterpret_cast<const Pack<T, kVec>*>(a);
  const auto* b_packs = reinterpret_cast<const Pack<T, kVec>*>(b);
  for (std::size_t p = tid; p < packs; p += stride) {
    Pack<T, kVec> d;
    Pack<T, kVec> y;
    const Pack<T, kVec> x = a_packs[p];
    if constexpr (Op::kReadsDst) d = dst_packs[p];
    if constexpr (Op::kUsesB) y = b_packs[p];
    Pack<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float d_k = 0.0f;
      float y_k = 0.0f;
      if constexpr (Op::kReadsDst) d_k = to_float(d.v[k]);
      if constexpr (Op::kUsesB) y_k = to_float(y.v[k]);
      out.v[k] = from_float<T>(Op::apply(d_k, to_float(x.v[k]), y_k));
    }
    dst_packs[p] = out;
  }
  const std::size_t i = packs * kVec + tid;  // the tail, fewer than kVec elements
  if (i < n) {
    float d_i = 0.0f;
    float y_i = 0.0f;
    if constexpr (Op::kReadsDst) d_i = to_float(dst[i]);
    if constexpr (Op::kUsesB) y_i = to_float(b[i]);
    dst[i] = from_float<T>(Op::apply(d_i, to_float(a[i]), y_i));
  }
}

namespace {

using detail::aligned;
using detail::check_flat_args;

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kElementwiseThreads);
}

template <typename T, typename Op>
void launch_typed(void* dst, const void* a, const void* b, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (aligned(dst, 16) && aligned(a, 16) && (!Op::kUsesB || aligned(b, 16))) {
    ZO_LAUNCH(fill_grid(n / kVec), kElementwiseThreads, 0, s, elementwise_kernel<T, kVec, Op>)
    (d, x, y, n);
  } else {
    ZO_LAUNCH(fill_grid(n), kElementwiseThreads, 0, s, elementwise_kernel<T, 1, Op>)(d, x, y, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename Op>
void launch(void* dst, const void* a, const void* b, std::size_t n, DType t, cudaStream_t s) {
  ZO_DISPATCH_DTYPE(t, T, launch_typed<T, Op>(dst, a, b, n, s));
}

// dst (fp32) += src (T): one element per thread, grid-stride; memory-bound and run once per
// micro-batch, so no vector path.
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    accumulate_f32_kernel(float* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] += to_float(src[i]);
}

}  // namespace

void launch_gelu_forward(void* out, const void* inp, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_gelu_forward", n, t, {{out, "out"}, {inp, "inp"}})) return;
  launch<GeluForwardOp>(out, inp, nullptr, n, t, s);
}

void launch_gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType t,
                          cudaStream_t s) {
  if (!check_flat_args("launch_gelu_backward", n, t,
                       {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}})) {
    return;
  }
  launch<GeluBackwardOp>(dinp, inp, dout, n, t, s);
}

void launch_gelu_grad_in_place(void* d, const void* pre, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_gelu_grad_in_place", n, t, {{d, "d"}, {pre, "pre"}})) return;
  launch<GeluGradScaleOp>(d, pre, nullptr, n, t, s);
}

void launch_residual_forward(void* out, const void* a, const void* b, std::size_t n, DType t,
                             cudaStream_t s) {
  if (!check_flat_args("launch_residual_forward", n, t, {{out, "out"}, {a, "a"}, {b, "b"}})) return;
  launch<AddOp>(out, a, b, n, t, s);
}

void launch_accumulate(void* dst, const void* src, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_accumulate", n, t, {{dst, "dst"}, {src, "src"}})) return;
  launch<AccumulateOp>(dst, src, nullptr, n, t, s);
}

void launch_accumulate_f32(float* dst, const void* src, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_accumulate_f32", n, t, {{dst, "dst"}, {src, "src"}})) return;
  ZO_DISPATCH_DTYPE(t, T, {
    ZO_LAUNCH(fill_grid(n), kElementwiseThreads, 0, s, accumulate_f32_kernel<T>)
    (dst, static_cast<const T*>(src), n);
  });
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace zo::gpu
