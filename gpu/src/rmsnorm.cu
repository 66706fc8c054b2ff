// RMSNorm over the last dimension (arXiv 1910.07467), Llama's: no mean, no bias, eps inside the
// square root; formulas as the host reference (src/device/host_ops_llama.cpp). Shapes:
// inp/out/dout/dinp (N,C), weight/dweight (C), rstd (N) fp32.
//
// Forward, rmsnorm_forward_kernel: one warp per row (kRmsThreads / 32 rows per block), lanes
// striding over packs of kVec (16 B of T; 1 when C or a pointer does not allow packs); two passes
// (sum of squares; output), fp32. rstd is written as the fp32 value the output used.
// Backward, deterministic without atomics or scratch:
//   1. rmsnorm_backward_dinp_kernel, warp per row: g = weight * dout, norm = x * rstd;
//      dinp = dresidual (0 when null; may be dinp itself) + rstd * (g - norm * mean(g * norm)).
//   2. rmsnorm_backward_dweight_kernel: dweight (C) += sum over rows of norm * dout. Block
//      (32, kRmsRowGroups): x over 32 consecutive channels (coalesced), y over interleaved rows,
//      each thread summing its rows in order, the block its row groups in y order; one block per
//      32 channels reads every row. Decision: no scratch and one kernel, at the price of only
//      C / 32 blocks of parallelism (128 for C = 4096; layernorm.cu's chunked partial sums are the
//      faster pattern if this shows in a profile).

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>

#include "block_reduce.cuh"
#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kRmsThreads = 256;  // 8 warps, 8 rows per block
constexpr int kRmsRowsPerBlock = kRmsThreads / 32;
constexpr int kRmsRowGroups = 16;  // y extent of the dweight kernel's (32, y) blocks

template <typename T, int kVec>
__global__ void __launch_bounds__(kRmsThreads)
    rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ inp,
                           const T* __restrict__ weight, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRmsRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;  // whole warps only: no block-level barrier below
  const std::size_t offset = static_cast<std::size_t>(row) * C;
  float sum_sq = 0.0f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec];
    load_floats<T, kVec>(inp + offset + c, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      sum_sq = fmaf(v[k], v[k], sum_sq);
  }
  const float rs = 1.0f / sqrtf(warp_sum(sum_sq) / static_cast<float>(C) + eps);
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], w[kVec], y[kVec];
    load_floats<T, kVec>(inp + offset + c, v);
    load_floats<T, kVec>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      y[k] = v[k] * rs * w[k];
    store_floats<T, kVec>(out + offset + c, y);
  }
  if (lane == 0) rstd[row] = rs;
}

// dinp (N,C) written = dres (kResidual; may alias dinp) + the input gradient of each row.
template <typename T, int kVec, bool kResidual>
__global__ void __launch_bounds__(kRmsThreads)
    rmsnorm_backward_dinp_kernel(T* dinp, const T* dres, const T* __restrict__ dout,
                                 const T* __restrict__ inp, const T* __restrict__ weight,
                                 const float* __restrict__ rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRmsRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const std::size_t offset = static_cast<std::size_t>(row) * C;
  const float rs = rstd[row];
  float g_norm_sum = 0.0f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], d[kVec], w[kVec];
    load_floats<T, kVec>(inp + offset + c, v);
    load_floats<T, kVec>(dout + offset + c, d);
    load_floats<T, kVec>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      g_norm_sum = fmaf(w[k] * d[k], v[k] * rs, g_norm_sum);
  }
  const float g_norm_mean = warp_sum(g_norm_sum) / static_cast<float>(C);
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], d[kVec], w[kVec], acc[kVec] = {};
    load_floats<T, kVec>(inp + offset + c, v);
    load_floats<T, kVec>(dout + offset + c, d);
    load_floats<T, kVec>(weight + c, w);
    if constexpr (kResidual) load_floats<T, kVec>(dres + offset + c, acc);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      acc[k] += (w[k] * d[k] - v[k] * rs * g_norm_mean) * rs;
    store_floats<T, kVec>(dinp + offset + c, acc);
  }
}

// dweight (C) += sum over the N rows of inp * rstd * dout. blockDim (32, kRmsRowGroups); grid
// ceil(C / 32).
template <typename T>
__global__ void __launch_bounds__(32 * kRmsRowGroups)
    rmsnorm_backward_dweight_kernel(T* __restrict__ dweight, const T* __restrict__ dout,
                                    const T* __restrict__ inp, const float* __restrict__ rstd,
                                    int N, int C) {
  __shared__ float partial[kRmsRowGroups][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int n = static_cast<int>(threadIdx.y); n < N; n += kRmsRowGroups) {
      const std::size_t i = static_cast<std::size_t>(n) * C + c;
      acc = fmaf(to_float(inp[i]) * rstd[n], to_float(dout[i]), acc);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
#pragma unroll
    for (int y = 0; y < kRmsRowGroups; ++y)
      sum += partial[y][threadIdx.x];
    dweight[c] = from_float<T>(to_float(dweight[c]) + sum);
  }
}

namespace {

using detail::aligned;

// False when N is 0 (nothing to do). Throws for an invalid dtype, N < 0, C <= 0 or a null pointer.
bool check_args(const char* op, int N, int C, DType t, std::initializer_list<detail::Named> ptrs) {
  detail::check_dtype(op, t);
  const std::string shape = "N = " + std::to_string(N) + ", C = " + std::to_string(C);
  if (!detail::check_rows(op, N, C, "C", "a row needs a mean square", shape)) return false;
  detail::check_not_null(op, ptrs, [&] { return shape; });
  return true;
}

// Whether rows of C elements of T at every pointer of `ptrs` allow 16-byte packs.
template <typename T>
bool packs(int C, std::initializer_list<const void*> ptrs) {
  if (C % (16 / static_cast<int>(sizeof(T))) != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && !aligned(p, 16)) return false;
  }
  return true;
}

template <typename T>
void forward_typed(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                   cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const int blocks = detail::ceil_div(N, kRmsRowsPerBlock);
  if (packs<T>(C, {out, inp, weight})) {
    ZO_LAUNCH(blocks, kRmsThreads, 0, s, rmsnorm_forward_kernel<T, kVec>)
    (out, rstd, inp, weight, N, C, eps);
  } else {
    ZO_LAUNCH(blocks, kRmsThreads, 0, s, rmsnorm_forward_kernel<T, 1>)
    (out, rstd, inp, weight, N, C, eps);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T, bool kResidual>
void backward_dinp(T* dinp, const T* dres, const T* dout, const T* inp, const T* weight,
                   const float* rstd, int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const int blocks = detail::ceil_div(N, kRmsRowsPerBlock);
  if (packs<T>(C, {dinp, dres, dout, inp, weight})) {
    ZO_LAUNCH(blocks, kRmsThreads, 0, s, rmsnorm_backward_dinp_kernel<T, kVec, kResidual>)
    (dinp, dres, dout, inp, weight, rstd, N, C);
  } else {
    ZO_LAUNCH(blocks, kRmsThreads, 0, s, rmsnorm_backward_dinp_kernel<T, 1, kResidual>)
    (dinp, dres, dout, inp, weight, rstd, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(T* dinp, const T* dres, T* dweight, const T* dout, const T* inp,
                    const T* weight, const float* rstd, int N, int C, cudaStream_t s) {
  // dweight first: dinp may alias dres, never inp or dout, so the order is free.
  ZO_LAUNCH(detail::ceil_div(C, 32), dim3(32, kRmsRowGroups), 0, s,
            rmsnorm_backward_dweight_kernel<T>)
  (dweight, dout, inp, rstd, N, C);
  ZO_CUDA_CHECK_LAUNCH();
  if (dres != nullptr) {
    backward_dinp<T, true>(dinp, dres, dout, inp, weight, rstd, N, C, s);
  } else {
    backward_dinp<T, false>(dinp, dres, dout, inp, weight, rstd, N, C, s);
  }
}

}  // namespace

void launch_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N,
                            int C, float eps, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_rmsnorm_forward";
  if (!check_args(op, N, C, t, {{out, "out"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}})) {
    return;
  }
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    detail::bad_arg(op, "eps = " + std::to_string(eps) + " must be finite and >= 0");
  }
  ZO_DISPATCH_DTYPE(t, T,
                    forward_typed<T>(static_cast<T*>(out), rstd, static_cast<const T*>(inp),
                                     static_cast<const T*>(weight), N, C, eps, s));
}

void launch_rmsnorm_backward(void* dinp, const void* dresidual, void* dweight, const void* dout,
                             const void* inp, const void* weight, const float* rstd, int N, int C,
                             DType t, cudaStream_t s) {
  if (!check_args("launch_rmsnorm_backward", N, C, t,
                  {{dinp, "dinp"},
                   {dweight, "dweight"},
                   {dout, "dout"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {rstd, "rstd"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      backward_typed<T>(static_cast<T*>(dinp), static_cast<const T*>(dresidual),
                        static_cast<T*>(dweight), static_cast<const T*>(dout),
                        static_cast<const T*>(inp), static_cast<const T*>(weight), rstd, N, C, s));
}

}  // namespace zo::gpu
