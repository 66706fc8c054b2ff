// The bias kernels of the matmul op that cuBLASLt's epilogues do not cover (matmul_bias.h says
// which and why).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "launch_util.h"
#include "matmul_bias.h"

namespace zo::gpu {
namespace {

constexpr int kCols = 32;            // output channels per block: one warp reads a row segment
constexpr int kLanes = 8;            // rows summed side by side in a block
constexpr int kRowsPerChunk = 256;   // rows per partial sum when the rows are split
constexpr int kMaxChunks = 65535;    // gridDim.y limit
constexpr int kFinishThreads = 256;  // one thread per output channel
constexpr int kBroadcastThreads = 256;
constexpr std::size_t kMaxBroadcastBlocks = 4096;  // grid-stride beyond that

// Block (kCols, kLanes) sums column blockIdx.x * kCols + threadIdx.x over the rows of chunk
// blockIdx.y: each lane takes every kLanes-th row, then lane 0 adds the kLanes sums in order.
// kDirect (a single chunk): the sum goes straight into dbias; otherwise into partial (chunks, OC).
template <typename T, bool kDirect>
__global__ void __launch_bounds__(kCols* kLanes)
    bias_partial_kernel(float* __restrict__ partial, T* __restrict__ dbias,
                        const T* __restrict__ dout, int N, int OC, int ld, int rows_per_chunk) {
  __shared__ float sums[kLanes][kCols];
  const int col = blockIdx.x * kCols + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float acc = 0.0f;
  if (col < OC) {
    for (int r = row_begin + static_cast<int>(threadIdx.y); r < row_end; r += kLanes)
      acc += to_float(dout[static_cast<std::size_t>(r) * ld + col]);
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= OC) return;
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kLanes; ++k)
    total += sums[k][threadIdx.x];
  if constexpr (kDirect) {
    dbias[col] = from_float<T>(to_float(dbias[col]) + total);
  } else {
    partial[static_cast<std::size_t>(blockIdx.y) * OC + col] = total;
  }
}

// dbias[col] += the chunks' partial sums, added in chunk order.
template <typename T>
__global__ void bias_finish_kernel(T* __restrict__ dbias, const float* __restrict__ partial,
                                   int chunks, int OC) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float total = 0.0f;
  for (int c = 0; c < chunks; ++c)
    total += partial[static_cast<std::size_t>(c) * OC + col];
  dbias[col] = from_float<T>(to_float(dbias[col]) + total);
}

// Element i of the N * OC is column i % OC of row i / OC.
template <typename T>
__global__ void bias_broadcast_kernel(T* __restrict__ out, const T* __restrict__ bias,
                                      std::size_t n, int OC, int ld) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const auto oc = static_cast<std::size_t>(OC);
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i / oc * static_cast<std::size_t>(ld) + i % oc] = bias[i % oc];
}

using detail::ceil_div;

void check_shape(const char* op, int N, int OC, int ld) {
  if (N <= 0 || OC <= 0) {
    detail::bad_arg(
        op, "N = " + std::to_string(N) + " and OC = " + std::to_string(OC) + " must both be > 0");
  }
  if (ld < OC) {
    detail::bad_arg(op, "the row stride ld = " + std::to_string(ld) +
                            " is less than OC = " + std::to_string(OC));
  }
}

}  // namespace

void launch_bias_broadcast(void* out, const void* bias, int N, int OC, int ld, DType t,
                           cudaStream_t s) {
  constexpr const char* op = "launch_bias_broadcast";
  check_shape(op, N, OC, ld);
  if (out == nullptr || bias == nullptr) {
    detail::bad_arg(op, "out and bias must not be null");
  }
  const std::size_t n = static_cast<std::size_t>(N) * static_cast<std::size_t>(OC);
  const std::size_t blocks =
      std::min<std::size_t>((n + kBroadcastThreads - 1) / kBroadcastThreads, kMaxBroadcastBlocks);
  ZO_DISPATCH_DTYPE(t, T, {
    ZO_LAUNCH(static_cast<unsigned>(blocks), kBroadcastThreads, 0, s, bias_broadcast_kernel<T>)
    (static_cast<T*>(out), static_cast<const T*>(bias), n, OC, ld);
  });
  ZO_CUDA_CHECK_LAUNCH();
}

void launch_bias_backward(void* dbias, const void* dout, int N, int OC, int ld, DType t,
                          float* scratch, std::size_t scratch_bytes, cudaStream_t s) {
  constexpr const char* op = "launch_bias_backward";
  check_shape(op, N, OC, ld);
  if (dbias == nullptr || dout == nullptr) {
    detail::bad_arg(op, "dbias and dout must not be null");
  }
  const std::size_t room =
      scratch == nullptr ? 0 : scratch_bytes / (sizeof(float) * static_cast<std::size_t>(OC));
  const int chunks_wanted = ceil_div(N, kRowsPerChunk);
  const int chunks_allowed =
      static_cast<int>(std::min<std::size_t>(room, static_cast<std::size_t>(kMaxChunks)));
  const int chunks = std::min(chunks_wanted, chunks_allowed);
  const dim3 block(kCols, kLanes);
  ZO_DISPATCH_DTYPE(t, T, {
    T* db = static_cast<T*>(dbias);
    const T* dy = static_cast<const T*>(dout);
    if (chunks < 2) {
      const dim3 grid(static_cast<unsigned>(ceil_div(OC, kCols)), 1);
      ZO_LAUNCH(grid, block, 0, s, bias_partial_kernel<T, true>)(nullptr, db, dy, N, OC, ld, N);
      ZO_CUDA_CHECK_LAUNCH();
    } else {
      // Equal chunks with none empty: rows_per_chunk first, then the chunks it takes.
      const int rows_per_chunk = ceil_div(N, chunks);
      const int used_chunks = ceil_div(N, rows_per_chunk);
      const dim3 grid(static_cast<unsigned>(ceil_div(OC, kCols)),
                      static_cast<unsigned>(used_chunks));
      ZO_LAUNCH(grid, block, 0, s, bias_partial_kernel<T, false>)
      (scratch, nullptr, dy, N, OC, ld, rows_per_chunk);
      ZO_CUDA_CHECK_LAUNCH();
      ZO_LAUNCH(static_cast<unsigned>(ceil_div(OC, kFinishThreads)), kFinishThreads, 0, s,
                bias_finish_kernel<T>)
      (db, scratch, used_chunks, OC);
      ZO_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace zo::gpu
