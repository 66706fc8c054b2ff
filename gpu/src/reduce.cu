// Launchers of sum_squares and nonfinite_flag (kernels and launch shapes in gpu/reduce.cuh).
#include <cstddef>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"
#include "gpu/reduce.cuh"
#include "launch_util.h"

namespace zo::gpu {
namespace {

using detail::aligned;
using detail::check_flat_args;

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kReduceThreads);
}

template <typename T>
void sum_squares_typed(float* out, const T* data, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const int blocks = sum_squares_blocks(n);
  detail::StreamScratch partial(sizeof(double) * static_cast<std::size_t>(blocks), s);
  if (aligned(data, 16)) {
    ZO_LAUNCH(blocks, kReduceThreads, 0, s, sum_squares_partial_kernel<T, kVec>)
    (partial.as<double>(), data, n);
  } else {
    ZO_LAUNCH(blocks, kReduceThreads, 0, s, sum_squares_partial_kernel<T, 1>)
    (partial.as<double>(), data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
  ZO_LAUNCH(1, kReduceThreads, 0, s, sum_squares_finish_kernel<double>)
  (out, partial.as<double>(), blocks);
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void nonfinite_flag_typed(float* flag, const T* data, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (aligned(data, 16)) {
    ZO_LAUNCH(fill_grid(n / kVec), kReduceThreads, 0, s, nonfinite_flag_kernel<T, kVec>)
    (flag, data, n);
  } else {
    ZO_LAUNCH(fill_grid(n), kReduceThreads, 0, s, nonfinite_flag_kernel<T, 1>)(flag, data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_sum_squares(float* out, const void* data, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_sum_squares", n, t, {{out, "out"}, {data, "data"}})) return;
  ZO_DISPATCH_DTYPE(t, T, sum_squares_typed<T>(out, static_cast<const T*>(data), n, s));
}

void launch_nonfinite_flag(float* flag, const void* data, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_nonfinite_flag", n, t, {{flag, "flag"}, {data, "data"}})) return;
  ZO_DISPATCH_DTYPE(t, T, nonfinite_flag_typed<T>(flag, static_cast<const T*>(data), n, s));
}

}  // namespace zo::gpu
