// Launchers of gelu_forward, gelu_backward, residual_forward and accumulate (kernel and launch
// shape in gpu/elementwise.cuh).
#include <cstddef>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/elementwise.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
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

void launch_residual_forward(void* out, const void* a, const void* b, std::size_t n, DType t,
                             cudaStream_t s) {
  if (!check_flat_args("launch_residual_forward", n, t, {{out, "out"}, {a, "a"}, {b, "b"}})) return;
  launch<AddOp>(out, a, b, n, t, s);
}

void launch_accumulate(void* dst, const void* src, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_accumulate", n, t, {{dst, "dst"}, {src, "src"}})) return;
  launch<AccumulateOp>(dst, src, nullptr, n, t, s);
}

}  // namespace zo::gpu
