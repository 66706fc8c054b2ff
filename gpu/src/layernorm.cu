// LayerNorm over the last dimension (arXiv 1607.06450), GPT-2 flavour: biased variance, eps 1e-5
// inside the square root; formulas as the host reference
// (src/device/host_ops_embedding_layernorm.cpp). Shapes: inp/out/dout/dinp (N,C), weight/bias
// (C), mean/rstd (N) fp32.
//
// Forward, layernorm_forward_kernel: one warp per row, kLayerNormThreads/32 rows per block,
// grid = ceil(N / rows per block). Lanes stride over the row in packs of kVec (16 B of T; 1 when
// C or a pointer does not allow packs). Three passes over the row (sum; sum of squared
// deviations, the two-pass variance; output), all fp32; the second and third re-read the row,
// which L1/L2 serve. mean and rstd are written as the fp32 values the output was computed with.
// The residual form (residual_layernorm_forward) first writes res = a + b, rounded to T, in pass
// 1 and normalises those rounded values: the bits of residual_forward then layernorm_forward,
// with one read of the row from memory instead of three (each lane re-reads only what it wrote).
//
// Backward (dinp = dresidual + d(LN)/d(inp), dweight +=, dbias +=), deterministic without
// atomics, in three kernels:
//   1. layernorm_backward_dinp_kernel: warp per row as the forward. Pass 1 reduces
//      g = weight * dout and g * norm over the row; pass 2 writes
//      dinp = dresidual (0 when null) + (g - mean(g) - norm * mean(g * norm)) * rstd; dresidual
//      may be dinp itself (the residual stream's gradient, accumulated in place).
//   2. layernorm_backward_partials_kernel: the column sums over N rows. Block (32, 8): x over
//      32 consecutive 16-byte packs of channels (one channel each when C or a pointer does not
//      allow packs), y over 8 interleaved rows; grid (column blocks, chunks), each blockIdx.y a
//      contiguous chunk of rows. Every thread adds norm*dout and dout over its rows in row order
//      in fp32, the block adds its 8 row groups in y order, and writes one fp32 partial per
//      (chunk, channel) to scratch.
//   3. layernorm_backward_finish_kernel: one thread per channel adds the chunks' partials in
//      chunk order and adds the total into dweight/dbias (one rounding to T).
//   The chunking is a function of (N, C) only (layernorm_backward_chunks), so the summation tree
//   and hence the bits are too. Kernel 2 re-reads inp and dout (2NC extra reads against the 4NC
//   of kernel 1) in exchange for a fixed reduction order with bounded scratch.

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

constexpr float kLayerNormEps = 1e-5f;  // GPT-2 / PyTorch default, as the host backend
constexpr int kLayerNormThreads = 256;  // 8 warps, 8 rows per block
constexpr int kLayerNormRowsPerBlock = kLayerNormThreads / 32;
constexpr int kLnPartialX = 32;  // channels per block of the column-sum kernel
constexpr int kLnPartialY = 8;   // row groups per block of the column-sum kernel

// Row chunks of the column-sum kernel: about 2048 blocks in all, at least 64 rows per chunk (8
// per thread); a function of the shape only.
inline int layernorm_backward_rows_per_chunk(int N, int C) {
  const long long col_blocks = (C + kLnPartialX - 1) / kLnPartialX;
  long long chunks = (2048 + col_blocks - 1) / col_blocks;
  const long long max_chunks = (static_cast<long long>(N) + 63) / 64;
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks < 1) chunks = 1;
  return static_cast<int>((N + chunks - 1) / chunks);
}

// out (N,C) written; mean, rstd (N) written. kResidual: res (N,C) written = inp + inp2, the row
// normalised; otherwise the row is inp (res and inp2 unused).
template <typename T, int kVec, bool kResidual>
__global__ void __launch_bounds__(kLayerNormThreads)
    layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean,
                             float* __restrict__ rstd, T* __restrict__ res,
                             const T* __restrict__ inp, const T* __restrict__ inp2,
                             const T* __restrict__ weight, const T* __restrict__ bias, int N,
                             int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kLayerNormRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;  // whole warps only: no block-level barrier below
  const std::size_t offset = static_cast<std::size_t>(row) * C;
  const T* x = (kResidual ? res : inp) + offset;
  T* o = out + offset;

  float sum = 0.0f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec];
    if constexpr (kResidual) {
      float w[kVec];
      load_floats<T, kVec>(inp + offset + c, v);
      load_floats<T, kVec>(inp2 + offset + c, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        v[k] = to_float(from_float<T>(v[k] + w[k]));
      store_floats<T, kVec>(res + offset + c, v);
    } else {
      load_floats<T, kVec>(x + c, v);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      sum += v[k];
  }
  const float m = warp_sum(sum) / static_cast<float>(C);

  float var = 0.0f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec];
    load_floats<T, kVec>(x + c, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float d = v[k] - m;
      var = fmaf(d, d, var);
    }
  }
  var = warp_sum(var) / static_cast<float>(C);
  const float rs = 1.0f / sqrtf(var + kLayerNormEps);

  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], w[kVec], b[kVec], y[kVec];
    load_floats<T, kVec>(x + c, v);
    load_floats<T, kVec>(weight + c, w);
    load_floats<T, kVec>(bias + c, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      y[k] = (v[k] - m) * rs * w[k] + b[k];
    store_floats<T, kVec>(o + c, y);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dinp (N,C) written = dres (kResidual; may alias dinp) + the input gradient of each row.
template <typename T, int kVec, bool kResidual>
__global__ void __launch_bounds__(kLayerNormThreads)
    layernorm_backward_dinp_kernel(T* dinp, const T* dres, const T* __restrict__ dout,
                                   const T* __restrict__ inp, const T* __restrict__ weight,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kLayerNormRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const std::size_t offset = static_cast<std::size_t>(row) * C;
  const T* x = inp + offset;
  const T* dy = dout + offset;
  T* dx = dinp + offset;
  const T* dr = kResidual ? dres + offset : nullptr;
  const float m = mean[row];
  const float rs = rstd[row];

  float g_sum = 0.0f;
  float g_norm_sum = 0.0f;
  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], d[kVec], w[kVec];
    load_floats<T, kVec>(x + c, v);
    load_floats<T, kVec>(dy + c, d);
    load_floats<T, kVec>(weight + c, w);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float g = w[k] * d[k];
      g_sum += g;
      g_norm_sum = fmaf(g, (v[k] - m) * rs, g_norm_sum);
    }
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(C);
  const float g_norm_mean = warp_sum(g_norm_sum) / static_cast<float>(C);

  for (int c = lane * kVec; c < C; c += 32 * kVec) {
    float v[kVec], d[kVec], w[kVec], acc[kVec] = {};
    load_floats<T, kVec>(x + c, v);
    load_floats<T, kVec>(dy + c, d);
    load_floats<T, kVec>(weight + c, w);
    if constexpr (kResidual) load_floats<T, kVec>(dr + c, acc);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float norm = (v[k] - m) * rs;
      acc[k] += (w[k] * d[k] - g_mean - norm * g_norm_mean) * rs;
    }
    store_floats<T, kVec>(dx + c, acc);
  }
}

// partial_w, partial_b (chunks, C) fp32 written: per chunk of rows, sum of norm*dout and dout.
// blockDim (kLnPartialX, kLnPartialY): x over kLnPartialX packs of kVec channels (16-byte loads
// when kVec > 1, C % kVec == 0), y over interleaved rows; grid (ceil(C / (kLnPartialX kVec)),
// chunks). Each thread adds its rows in row order, then the block its row groups in y order.
template <typename T, int kVec>
__global__ void __launch_bounds__(kLnPartialX* kLnPartialY)
    layernorm_backward_partials_kernel(float* __restrict__ partial_w, float* __restrict__ partial_b,
                                       const T* __restrict__ dout, const T* __restrict__ inp,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ rstd, int N, int C,
                                       int rows_per_chunk) {
  constexpr int kCols = kLnPartialX * kVec;  // channels per block
  __shared__ float shared_w[kLnPartialY][kCols];
  __shared__ float shared_b[kLnPartialY][kCols];
  const int col0 = blockIdx.x * kCols;
  const int c = col0 + static_cast<int>(threadIdx.x) * kVec;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = row_begin + min(N - row_begin, rows_per_chunk);  // no int overflow
  float acc_w[kVec] = {}, acc_b[kVec] = {};
  if (c < C) {
#pragma unroll 4
    for (int n = row_begin + static_cast<int>(threadIdx.y); n < row_end; n += kLnPartialY) {
      const std::size_t i = static_cast<std::size_t>(n) * C + c;
      float d[kVec], x[kVec];
      load_floats<T, kVec>(dout + i, d);
      load_floats<T, kVec>(inp + i, x);
      const float m = mean[n], r = rstd[n];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        acc_w[k] = fmaf((x[k] - m) * r, d[k], acc_w[k]);
        acc_b[k] += d[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    shared_w[threadIdx.y][threadIdx.x * kVec + k] = acc_w[k];
    shared_b[threadIdx.y][threadIdx.x * kVec + k] = acc_b[k];
  }
  __syncthreads();
  const int tid = threadIdx.y * kLnPartialX + threadIdx.x;
  for (int j = tid; j < kCols && col0 + j < C; j += kLnPartialX * kLnPartialY) {
    float w = 0.0f;
    float b = 0.0f;
#pragma unroll
    for (int y = 0; y < kLnPartialY; ++y) {
      w += shared_w[y][j];
      b += shared_b[y][j];
    }
    const std::size_t o = static_cast<std::size_t>(blockIdx.y) * C + col0 + j;
    partial_w[o] = w;
    partial_b[o] = b;
  }
}

// dweight, dbias (C) += the sums of the chunks' partials, in chunk order. One thread per channel.
template <typename T>
__global__ void __launch_bounds__(kLayerNormThreads)
    layernorm_backward_finish_kernel(T* __restrict__ dweight, T* __restrict__ dbias,
                                     const float* __restrict__ partial_w,
                                     const float* __restrict__ partial_b, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f;
  float b = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    const std::size_t i = static_cast<std::size_t>(k) * C + c;
    w += partial_w[i];
    b += partial_b[i];
  }
  dweight[c] = from_float<T>(to_float(dweight[c]) + w);
  dbias[c] = from_float<T>(to_float(dbias[c]) + b);
}

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

// kResidual: res = inp + inp2 is normalised (residual_layernorm_forward).
template <typename T, bool kResidual>
void forward_typed(T* out, float* mean, float* rstd, T* res, const T* inp, const T* inp2,
                   const T* weight, const T* bias, int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (C % kVec == 0 && aligned(out, 16) && aligned(inp, 16) && aligned(weight, 16) &&
      aligned(bias, 16) && (!kResidual || (aligned(res, 16) && aligned(inp2, 16)))) {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_forward_kernel<T, kVec, kResidual>)
    (out, mean, rstd, res, inp, inp2, weight, bias, N, C);
  } else {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s, layernorm_forward_kernel<T, 1, kResidual>)
    (out, mean, rstd, res, inp, inp2, weight, bias, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T, bool kResidual>
void backward_dinp(T* dinp, const T* dres, const T* dout, const T* inp, const T* weight,
                   const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (C % kVec == 0 && aligned(dinp, 16) && aligned(dout, 16) && aligned(inp, 16) &&
      aligned(weight, 16) && (!kResidual || aligned(dres, 16))) {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s,
              layernorm_backward_dinp_kernel<T, kVec, kResidual>)
    (dinp, dres, dout, inp, weight, mean, rstd, N, C);
  } else {
    ZO_LAUNCH(row_blocks(N), kLayerNormThreads, 0, s,
              layernorm_backward_dinp_kernel<T, 1, kResidual>)
    (dinp, dres, dout, inp, weight, mean, rstd, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(T* dinp, const T* dres, T* dweight, T* dbias, const T* dout, const T* inp,
                    const T* weight, const float* mean, const float* rstd, int N, int C,
                    float* scratch, cudaStream_t s) {
  // 1. dinp, row by row.
  if (dres != nullptr) {
    backward_dinp<T, true>(dinp, dres, dout, inp, weight, mean, rstd, N, C, s);
  } else {
    backward_dinp<T, false>(dinp, dres, dout, inp, weight, mean, rstd, N, C, s);
  }

  // 2. Column partial sums per chunk of rows, 3. their fixed-order sum into dweight/dbias.
  const int rows_per_chunk = layernorm_backward_rows_per_chunk(N, C);
  const int chunks = detail::ceil_div(N, rows_per_chunk);
  const std::size_t partial_elements = static_cast<std::size_t>(chunks) * C;
  float* partial_w = scratch;                     // (chunks, C)
  float* partial_b = scratch + partial_elements;  // (chunks, C)
  const dim3 block(kLnPartialX, kLnPartialY);
  constexpr int kVec = 16 / sizeof(T);
  if (C % kVec == 0 && aligned(dout, 16) && aligned(inp, 16)) {
    const dim3 grid(detail::ceil_div(C, kLnPartialX * kVec), chunks);
    ZO_LAUNCH(grid, block, 0, s, layernorm_backward_partials_kernel<T, kVec>)
    (partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
  } else {
    const dim3 grid(detail::ceil_div(C, kLnPartialX), chunks);
    ZO_LAUNCH(grid, block, 0, s, layernorm_backward_partials_kernel<T, 1>)
    (partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
  }
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
      forward_typed<T, false>(static_cast<T*>(out), mean, rstd, nullptr, static_cast<const T*>(inp),
                              nullptr, static_cast<const T*>(weight), static_cast<const T*>(bias),
                              N, C, s));
}

void launch_residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                       const void* a, const void* b, const void* weight,
                                       const void* bias, int N, int C, DType t, cudaStream_t s) {
  if (!check_args("launch_residual_layernorm_forward", N, C, t,
                  {{res, "res"},
                   {out, "out"},
                   {mean, "mean"},
                   {rstd, "rstd"},
                   {a, "a"},
                   {b, "b"},
                   {weight, "weight"},
                   {bias, "bias"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      forward_typed<T, true>(static_cast<T*>(out), mean, rstd, static_cast<T*>(res),
                             static_cast<const T*>(a), static_cast<const T*>(b),
                             static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, s));
}

std::size_t layernorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  const int chunks = detail::ceil_div(N, layernorm_backward_rows_per_chunk(N, C));
  return 2 * static_cast<std::size_t>(chunks) * static_cast<std::size_t>(C) * sizeof(float);
}

void launch_layernorm_backward(void* dinp, const void* dresidual, void* dweight, void* dbias,
                               const void* dout, const void* inp, const void* weight,
                               const float* mean, const float* rstd, int N, int C, DType t,
                               void* scratch, cudaStream_t s) {
  if (!check_args("launch_layernorm_backward", N, C, t,
                  {{dinp, "dinp"},
                   {dweight, "dweight"},
                   {dbias, "dbias"},
                   {dout, "dout"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {mean, "mean"},
                   {rstd, "rstd"},
                   {scratch, "scratch"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(t, T,
                    backward_typed<T>(static_cast<T*>(dinp), static_cast<const T*>(dresidual),
                                      static_cast<T*>(dweight), static_cast<T*>(dbias),
                                      static_cast<const T*>(dout), static_cast<const T*>(inp),
                                      static_cast<const T*>(weight), mean, rstd, N, C,
                                      static_cast<float*>(scratch), s));
}

}  // namespace zo::gpu
