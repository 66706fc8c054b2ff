// Launchers of layernorm_forward and layernorm_backward (kernels and launch shapes in
// gpu/layernorm.cuh).
#include <cstddef>
#include <initializer_list>
#include <string>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/layernorm.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

using detail::aligned;

// False when N is 0 (nothing to do). Throws for an invalid dtype, N < 0, C <= 0 (a row needs a
// mean) or a null pointer.
bool check_args(const char* op, int N, int C, DType t, std::initializer_list<detail::Named> ptrs) {
  detail::check_dtype(op, t);
  const std::string shape = "N = " + std::to_string(N) + ", C = " + std::to_string(C);
  if (!detail::check_rows(op, N, C, "C", "a row needs a mean", shape)) return false;
  detail::check_not_null(op, ptrs, [&] { return shape; });
  return true;
}

int row_blocks(int N) {
  return detail::ceil_div(N, kLayerNormRowsPerBlock);
}

template <typename T>
void forward_typed(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                   int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (C % kVec == 0 && aligned(out, 16) && aligned(inp, 16) && aligned(weight, 16) &&
      aligned(bias, 16)) {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_forward_kernel<T, kVec>)
    (out, mean, rstd, inp, weight, bias, N, C);
  } else {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_forward_kernel<T, 1>)
    (out, mean, rstd, inp, weight, bias, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  // 1. dinp, row by row.
  if (C % kVec == 0 && aligned(dinp, 16) && aligned(dout, 16) && aligned(inp, 16) &&
      aligned(weight, 16)) {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_backward_dinp_kernel<T, kVec>)
    (dinp, dout, inp, weight, mean, rstd, N, C);
  } else {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_backward_dinp_kernel<T, 1>)
    (dinp, dout, inp, weight, mean, rstd, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();

  // 2. Column partial sums per chunk of rows, 3. their fixed-order sum into dweight/dbias.
  const int rows_per_chunk = layernorm_backward_rows_per_chunk(N, C);
  const int chunks = detail::ceil_div(N, rows_per_chunk);
  const std::size_t partial_elements = static_cast<std::size_t>(chunks) * C;
  detail::StreamScratch scratch(2 * partial_elements * sizeof(float), s);
  float* partial_w = scratch.as<float>();
  float* partial_b = scratch.as<float>() + partial_elements;
  const dim3 block(kLnPartialX, kLnPartialY);
  const dim3 grid(detail::ceil_div(C, kLnPartialX), chunks);
  ZO_LAUNCH(grid, block, 0, s, layernorm_backward_partials_kernel<T>)
  (partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
  ZO_CUDA_CHECK_LAUNCH();
  ZO_LAUNCH(detail::ceil_div(C, kLayerNormThreads), kLayerNormThreads, 0, s,
            layernorm_backward_finish_kernel<T>)
  (dweight, dbias, partial_w, partial_b, chunks, C);
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                              const void* weight, const void* bias, int N, int C, DType t,
                              cudaStream_t s) {
  if (!check_args("launch_layernorm_forward", N, C, t,
                  {{out, "out"},
                   {mean, "mean"},
                   {rstd, "rstd"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {bias, "bias"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      forward_typed<T>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                       static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, s));
}

void launch_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const float* mean,
                               const float* rstd, int N, int C, DType t, cudaStream_t s) {
  if (!check_args("launch_layernorm_backward", N, C, t,
                  {{dinp, "dinp"},
                   {dweight, "dweight"},
                   {dbias, "dbias"},
                   {dout, "dout"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {mean, "mean"},
                   {rstd, "rstd"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      backward_typed<T>(static_cast<T*>(dinp), static_cast<T*>(dweight), static_cast<T*>(dbias),
                        static_cast<const T*>(dout), static_cast<const T*>(inp),
                        static_cast<const T*>(weight), mean, rstd, N, C, s));
}

}  // namespace zo::gpu
